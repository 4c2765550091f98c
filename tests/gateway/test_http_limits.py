"""Slow or bloated connections to a real gateway process are cut off, and cost nothing more.

A head sent up to its last header line and no further, a connection that sends nothing,
a head of hundreds of KiB and one of thousands of header fields: each once stayed open or
was accepted. Each test waits on the socket itself (the server closing it), never a clock.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from gateway.http_limits import HEAD_TIMEOUT_S, MAX_HEADER_BYTES, MAX_HEADERS
from tests.support.gateway import gateway_process


@pytest.fixture(scope="module")
def address(pg_dsn: str) -> Iterator[tuple[str, int]]:
    with gateway_process(pg_dsn) as (url, _):
        parts = urlsplit(url)
        yield parts.hostname or "127.0.0.1", parts.port or 80


def _closed_after(sock: socket.socket, deadline_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took."""
    sock.settimeout(deadline_s)
    started, got = time.monotonic(), b""
    while chunk := sock.recv(65536):
        got += chunk
    return got, time.monotonic() - started


@pytest.mark.parametrize(
    "sent",
    [b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"],
    ids=["nothing", "a head without its end"],
)
def test_a_head_that_does_not_arrive_in_time_closes_the_connection(
    address: tuple[str, int], sent: bytes
) -> None:
    with socket.create_connection(address) as sock:
        sock.sendall(sent)
        got, waited = _closed_after(sock, HEAD_TIMEOUT_S + 20)
    assert got == b""  # closed, nothing answered
    assert waited < HEAD_TIMEOUT_S + 20


@pytest.mark.parametrize(
    "headers",
    [
        b"X-Big: " + b"a" * (MAX_HEADER_BYTES + 1) + b"\r\n",
        b"".join(b"X-%d: 1\r\n" % i for i in range(MAX_HEADERS + 1)),
    ],
    ids=["a huge header", "too many headers"],
)
def test_an_oversized_head_is_a_400_and_the_connection_closes(
    address: tuple[str, int], headers: bytes
) -> None:
    with socket.create_connection(address) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n" + headers + b"\r\n")
        got, _ = _closed_after(sock, 30)
    assert got.startswith(b"HTTP/1.1 400")


def test_an_ordinary_request_still_gets_its_answer(address: tuple[str, int]) -> None:
    with socket.create_connection(address) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        got, _ = _closed_after(sock, 30)
    assert got.startswith(b"HTTP/1.1 200")
