"""FedLab's ``DistNetwork`` whose rendezvous listens only on the address it is given.

FedLab 1.3.0 joins torch.distributed with ``init_method="tcp://HOST:PORT"``. torch (2.x,
measured with 2.14) then starts rank 0's ``TCPStore`` on ``PORT`` of *every* interface
(``*:PORT``, whatever ``HOST`` is), and that store takes reads and writes from anyone who
reaches it, with no authentication. Here rank 0 binds the listening socket itself, on ``HOST``
only, and hands it to the store (``master_listen_fd``); gloo's own sockets (one per rank) bind
to the interface ``GLOO_SOCKET_IFNAME`` names, set to the loopback interface when ``HOST`` is a
loopback address and neither FedLab's ``ethernet`` nor the user has set it. Every other step is
FedLab's (its ``send``/``recv`` are untouched). docs/hosts/fedlab.md says what this leaves to
the user across machines.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from datetime import timedelta

import torch.distributed as dist
from fedlab.core.network import DistNetwork

from fl_adapters.run.processes import is_loopback, loopback_interface, port_problem
from fl_checks import ParameterError

#: torch.distributed's own default for gloo: how long the ranks wait for each other to join.
JOIN_TIMEOUT = timedelta(minutes=30)
GLOO_IFNAME = "GLOO_SOCKET_IFNAME"


def loopback_host(host: str) -> bool:
    """``host`` is (or resolves only to) a loopback address."""
    try:
        return is_loopback(host)
    except ValueError:  # a name: every address it resolves to
        try:
            found = {info[4][0] for info in socket.getaddrinfo(host, None)}
        except OSError:
            return False
        return bool(found) and all(is_loopback(str(ipaddress.ip_address(a))) for a in found)


def listen_on(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` (``SO_REUSEADDR``, as torch's store binds), or a
    one-line error naming the port and what to do."""
    problem = port_problem(host, port)
    if problem is not None:
        raise ParameterError(
            f"FedLab's server cannot listen on {host}:{port}: it {problem}; stop that process "
            "or set another port: in the config"
        )
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(socket.SOMAXCONN)
    return sock


class BoundNetwork(DistNetwork):
    """``DistNetwork`` whose rank 0 serves the rendezvous store on its address only."""

    def init_network_connection(self) -> None:
        self._LOGGER.info(self.__str__())
        host, port = str(self.address[0]), int(self.address[1])
        if self.ethernet is not None:  # FedLab's own switch, as its DistNetwork does
            os.environ[GLOO_IFNAME] = self.ethernet
        elif GLOO_IFNAME not in os.environ and loopback_host(host):
            lo = loopback_interface()
            if lo is not None:
                os.environ[GLOO_IFNAME] = lo
        if self.rank == 0:
            # The store owns the socket from here (it closes it when it stops).
            fd = listen_on(host, port).detach()
            store = dist.TCPStore(
                host, port, self.world_size, True, JOIN_TIMEOUT, master_listen_fd=fd
            )
        else:
            store = dist.TCPStore(host, port, self.world_size, False, JOIN_TIMEOUT)
        dist.init_process_group(
            backend=self.dist_backend,
            store=store,
            rank=self.rank,
            world_size=self.world_size,
            timeout=JOIN_TIMEOUT,
        )
