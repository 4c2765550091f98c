"""Free TCP ports on the loopback interface, picked where no outgoing connection lands.

A port that is free when picked can still be taken before the server we pick it for binds
it. The usual thief is not another server but an outgoing connection: every client socket
(a SeaweedFS part calling its master, a worker calling Postgres) gets a local port from the
kernel's ephemeral range, and ``bind(("", 0))`` hands out ports from that same range. So
ports are picked below it instead, and checked free by binding them.
"""

from __future__ import annotations

import itertools
import random
import socket
from collections.abc import Collection
from pathlib import Path

LOCAL_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT_RANGE = (32768, 60999)
LOWEST = 15000  # above the ports well-known services and dev servers tend to claim


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (inclusive)."""
    try:
        low, high = (int(part) for part in LOCAL_PORT_RANGE.read_text().split())
    except (OSError, ValueError):
        return LINUX_DEFAULT_RANGE
    return low, high


def _is_free(host: str, port: int) -> bool:
    """Whether a TCP listener could bind ``port`` on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _kernel_pick(host: str) -> int:
    """A port the kernel picks (from the ephemeral range): the fallback where the machine
    leaves no room below it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# Each process walks the band from a random start, so it never hands out a port twice
# (a part may not have bound the last one yet) and two processes rarely meet.
_turn = itertools.count(random.randrange(1 << 20))
_handed: set[int] = set()


def free_ports(
    count: int,
    host: str = "127.0.0.1",
    *,
    grpc_offset: int = 0,
    avoid: Collection[int] = (),
) -> list[int]:
    """``count`` distinct free ports; with ``grpc_offset`` each ``port + offset`` is free too.

    SeaweedFS listens for gRPC on ``port + 10000`` unless told otherwise, so callers that
    cannot name every gRPC port ask for pairs. Both ports of a pair lie below the
    ephemeral range when the machine leaves room for them there. No port of a pair is in
    ``avoid``: ports another part of the caller's stack will bind later, free right now.
    """
    taken = _handed.union(avoid)
    band = ephemeral_range()[0] - grpc_offset - LOWEST  # how many ports p fit below it
    out: list[int] = []
    for _ in range(max(band, 0)):
        if len(out) == count:
            break
        port = LOWEST + next(_turn) % band
        pair = (port, port + grpc_offset)
        if not taken.intersection(pair) and all(_is_free(host, p) for p in pair):
            _handed.update(pair)
            taken.update(pair)
            out.append(port)
    while len(out) < count:  # no room below the ephemeral range: let the kernel pick
        port = _kernel_pick(host)
        pair = (port, port + grpc_offset)
        if not taken.intersection(pair) and pair[1] <= 65535 and _is_free(host, pair[1]):
            taken.update(pair)
            out.append(port)
    return out


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now, below the ephemeral range."""
    return free_ports(1, host)[0]
