"""Free ports are picked below the kernel's ephemeral range, where no outgoing connection
can take one before its server binds it."""

from __future__ import annotations

import itertools
import socket

import pytest

from kvgate.stack import ports


def test_ports_and_their_grpc_pairs_lie_below_the_ephemeral_range_and_bind() -> None:
    low, _ = ports.ephemeral_range()
    picked = ports.free_ports(4, grpc_offset=10000) + ports.free_ports(3)
    assert len(set(picked)) == 7  # not one handed out twice, across calls too
    for port in picked[:4]:
        assert ports.LOWEST <= port < port + 10000 < low
    for port in picked[4:]:
        assert ports.LOWEST <= port < low
    for port in [*picked, *(p + 10000 for p in picked[:4])]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_something_listens_on_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = ports.free_port()
    band = ports.ephemeral_range()[0] - ports.LOWEST
    with socket.socket() as held:
        held.bind(("127.0.0.1", taken))
        held.listen()
        monkeypatch.setattr(ports, "_handed", set())
        monkeypatch.setattr(ports, "_turn", itertools.count(taken - ports.LOWEST))
        assert ports.free_port() == ports.LOWEST + (taken + 1 - ports.LOWEST) % band


def test_with_no_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    picked = ports.free_ports(3)
    assert len(set(picked)) == 3
    for port in picked:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_ports_to_avoid_are_passed_over_with_their_grpc_pairs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # what `kvgate up` does: SeaweedFS, started first, must not pick the ports of the
    # services that bind theirs after it (the gateway's, tierd's metrics...)
    start = ports.free_port()
    monkeypatch.setattr(ports, "_handed", set())
    monkeypatch.setattr(ports, "_turn", itertools.count(start - ports.LOWEST))
    avoid = {start, start + 1 + 10000}  # the first port, the second one's gRPC pair
    picked = ports.free_ports(2, grpc_offset=10000, avoid=avoid)
    for port in picked:
        assert not avoid.intersection((port, port + 10000))
    assert not avoid & ports._handed, "an avoided port is not handed out later either"
