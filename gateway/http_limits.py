"""What a connection to the public endpoint may cost before it is refused: header size and
count, and the time a request's head and body may take to arrive.

uvicorn's httptools protocol takes headers of any size and count and waits for a
half-sent request forever, so a few slow or bloated connections could hold a replica's
memory and sockets (an 8 MiB header and 20,000 headers were accepted; a request sent up to
its last header line stayed open past 60 s). This protocol is that one with limits: a head
over :data:`MAX_HEADER_BYTES` or :data:`MAX_HEADERS` is a 400 and the connection closes,
and a head (or a body) that has not arrived within its timeout closes the connection.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: bytes of request line and headers (browsers send a few KiB; nginx allows 4 x 8 KiB)
MAX_HEADER_BYTES = 64 * 1024
#: header fields in one request
MAX_HEADERS = 100
#: seconds from a connection's opening, or a request's first byte, to its last header
HEAD_TIMEOUT_S = 10.0
#: seconds from a request's last header to the end of its body
BODY_TIMEOUT_S = 60.0


class HeadTooLarge(Exception):
    """The request's head passed a limit (the parser then answers 400 and closes)."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the limits above."""

    _timer: asyncio.TimerHandle | None = None
    _head_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(HEAD_TIMEOUT_S)  # a connection that never sends a byte is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._arm(HEAD_TIMEOUT_S)

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        if len(self.headers) >= MAX_HEADERS:
            raise HeadTooLarge(f"more than {MAX_HEADERS} header fields")
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._arm(BODY_TIMEOUT_S)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _count(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > MAX_HEADER_BYTES:
            raise HeadTooLarge(f"a request head over {MAX_HEADER_BYTES} bytes")

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _too_slow(self) -> None:
        self._timer = None
        if not self.transport.is_closing():
            self.transport.close()
