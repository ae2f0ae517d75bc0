"""The keys and certificates of one local Flower deployment, made afresh for each run.

:func:`make_run_keys` writes into a directory of the run (mode 0700):

* a TLS certificate for the SuperLink (``127.0.0.1`` and ``localhost``), signed by a CA made
  for this run alone. The CA's private key is never written: it signs the one server
  certificate in memory and is dropped, so nobody can mint a second certificate the run's
  SuperNodes and ``flwr`` command would trust.
* one EC key pair per SuperNode (NIST P-384, OpenSSH format, as ``flower-supernode
  --auth-supernode-private-key`` and ``flwr supernode register`` read them): the SuperLink,
  started with ``--enable-supernode-auth``, lets in only the public keys the runner registered.
* the Control API token (:mod:`fl_adapters.flower.superlink`): only a caller holding it may
  start runs, register nodes or read the run's logs.
* the SuperExec secret (``--superexec-auth-secret-file``): the Runtime APIs of the SuperLink
  and the SuperNodes hand an app's task (the global model, the node's reply) only to a
  SuperExec that signs its request with it.

Private keys and secrets are created with mode 0600 (never readable by anyone else, not even
for an instant); public keys and certificates 0644. Flower's own guide makes the same files with
``openssl`` and ``ssh-keygen`` (``how-to-enable-tls-connections``,
``how-to-authenticate-supernodes``); ``cryptography`` is already a dependency of ``flwr``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: How long the run's certificates are valid: longer than any run's deadline (a day by default).
VALIDITY = datetime.timedelta(days=30)
#: Accepted clock skew between this machine's processes (the certificate starts this early).
SKEW = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class RunKeys:
    """Where :func:`make_run_keys` put the run's files."""

    dir: Path
    ca_cert: Path
    server_cert: Path
    server_key: Path
    node_keys: list[Path]  # private, OpenSSH; the public key is beside it with ``.pub``
    control_token: Path
    superexec_secret: Path

    def node_public(self, i: int) -> Path:
        return self.node_keys[i].with_suffix(".pub")

    def token(self) -> str:
        return self.control_token.read_text(encoding="ascii").strip()


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file of mode 0600 (an old file there is replaced)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def write_public(path: Path, data: bytes) -> None:
    path.unlink(missing_ok=True)
    path.write_bytes(data)
    path.chmod(0o644)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _certificates(hosts: list[str]) -> tuple[bytes, bytes, bytes]:
    """PEM of a fresh CA certificate, and of a server certificate and key it signed."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = _name(f"fedbalance run CA {secrets.token_hex(4)}")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA384())
    )
    key = ec.generate_private_key(ec.SECP384R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA384())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    pem = serialization.Encoding.PEM
    return ca.public_bytes(pem), server.public_bytes(pem), key_pem


def node_key_pair() -> tuple[bytes, bytes]:
    """A SuperNode's EC P-384 key pair, OpenSSH format: (private, public)."""
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return private, public + b"\n"


def make_run_keys(
    directory: str | os.PathLike[str],
    num_nodes: int,
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
) -> RunKeys:
    """Fresh certificates, node keys and Control API token in ``directory`` (see the module
    docstring); files an earlier run left there are replaced."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)
    ca_pem, server_pem, server_key_pem = _certificates(list(hosts))
    keys = RunKeys(
        dir=d,
        ca_cert=d / "ca.pem",
        server_cert=d / "server.pem",
        server_key=d / "server-key.pem",
        node_keys=[d / f"supernode-{i}.key" for i in range(num_nodes)],
        control_token=d / "control-token",
        superexec_secret=d / "superexec-secret",
    )
    write_public(keys.ca_cert, ca_pem)
    write_public(keys.server_cert, server_pem)
    write_private(keys.server_key, server_key_pem)
    for i, path in enumerate(keys.node_keys):
        private, public = node_key_pair()
        write_private(path, private)
        write_public(keys.node_public(i), public)
    write_private(keys.control_token, secrets.token_urlsafe(32).encode("ascii") + b"\n")
    write_private(keys.superexec_secret, secrets.token_bytes(32))
    return keys
