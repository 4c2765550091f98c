"""Free TCP ports on the loopback interface."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(count: int, host: str = "127.0.0.1", *, grpc_offset: int = 0) -> list[int]:
    """``count`` distinct free ports; with ``grpc_offset`` each ``port + offset`` is free too.

    SeaweedFS listens for gRPC on ``port + 10000`` unless told otherwise, so callers that
    cannot name every gRPC port ask for pairs.
    """
    out: list[int] = []
    while len(out) < count:
        port = free_port(host)
        if port in out or (grpc_offset and port + grpc_offset > 65535):
            continue
        if grpc_offset:
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind((host, port + grpc_offset))
            except OSError:
                continue
        out.append(port)
    return out
