"""Ports for the runs' servers: free, distinct, and out of the range outgoing sockets use."""

from __future__ import annotations

import socket

import pytest

from fl_adapters import processes


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low, _ = processes.ephemeral_range()
    ports = processes.free_ports(8)
    assert len(set(ports)) == 8
    assert all(processes.LOWEST_PORT <= p < low for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_free_ports_skip_ports_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    # Eight ports, six of them held by listeners: the other two are the answer, whatever
    # the offset the scan starts at.
    base = processes.free_ports(1)[0] // 8 * 8
    held = []
    try:
        for p in range(base, base + 8):
            s = socket.socket()
            s.bind(("127.0.0.1", p))
            held.append(s)
    except OSError:
        pytest.skip(f"ports {base}..{base + 7} not all free on this machine now")
    try:
        keep = [s for i, s in enumerate(held) if i not in (2, 5)]
        for i in (2, 5):
            held[i].close()
        for s in keep:
            s.listen()
        monkeypatch.setattr(processes, "LOWEST_PORT", base)
        monkeypatch.setattr(processes, "ephemeral_range", lambda: (base + 8, 60999))
        assert sorted(processes.free_ports(2)) == [base + 2, base + 5]
    finally:
        for s in held:
            s.close()
