"""A fault-injecting HTTP proxy, put in front of the object store by ``kvgate bench faults``.

Everything that talks S3 (workers, tierd) is pointed at this proxy instead of SeaweedFS;
it forwards each request unchanged (the ``Host`` header too, which SigV4 signs) and
answers with SeaweedFS' reply, unless a fault is set:

- ``down``: the port is closed and open connections are cut, as when the server dies;
- ``error_every``: every n-th request is answered ``503 SlowDown`` without reaching
  SeaweedFS, as an overloaded S3 answers;
- ``delay_s``: every forwarded request waits this long first, as a slow S3 does.

The fault is set over a second port (``PUT /fault`` with a JSON body, ``GET /fault`` for
the current one and the counts), so the benchmark changes it while the stack runs.

Run as ``python -m kvgate.bench.faults.proxy --upstream URL --port N --control-port M``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

import aiohttp
import click
from aiohttp import web

#: headers of one hop, never forwarded (RFC 9110 section 7.6.1, plus ``Expect``: aiohttp
#: answers ``100-continue`` itself, and the body is forwarded whole)
HOP_HEADERS = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "transfer-encoding", "upgrade", "expect",
    }
)  # fmt: skip
SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


@dataclass(frozen=True)
class Fault:
    """What the proxy does to requests now (the default: nothing)."""

    down: bool = False
    #: answer every n-th request 503 (0: never)
    error_every: int = 0
    #: seconds each forwarded request waits before it is sent on
    delay_s: float = 0.0

    @classmethod
    def parse(cls, body: object) -> Fault:
        """A fault from a JSON object; ``ValueError`` naming the field that is wrong."""
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        if unknown := set(body) - {f.name for f in dataclasses.fields(cls)}:
            raise ValueError(f"unknown fields {sorted(unknown)}")
        fault = cls(
            down=body.get("down", False),
            error_every=body.get("error_every", 0),
            delay_s=body.get("delay_s", 0.0),
        )
        if not isinstance(fault.down, bool):
            raise ValueError("down must be true or false")
        if type(fault.error_every) is not int or fault.error_every < 0:
            raise ValueError("error_every must be a whole number >= 0")
        if not isinstance(fault.delay_s, int | float) or not 0 <= fault.delay_s <= 600:
            raise ValueError("delay_s must be a number of seconds in [0, 600]")
        return fault


class FaultProxy:
    """The proxy and its control endpoint, run on the current event loop."""

    def __init__(self, upstream: str, host: str, port: int, control_port: int) -> None:
        self.upstream = upstream.rstrip("/")
        self.host, self.port, self.control_port = host, port, control_port
        self.fault = Fault()
        self.requests = 0
        self.injected_errors = 0
        self._session: aiohttp.ClientSession | None = None
        self._proxy = web.AppRunner(self._proxy_app(), access_log=None)
        self._control = web.AppRunner(self._control_app(), access_log=None)
        self._site: web.TCPSite | None = None

    async def start(self) -> None:
        """Listen on both ports."""
        timeout = aiohttp.ClientTimeout(total=120)
        self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        await self._proxy.setup()
        await self._control.setup()
        await web.TCPSite(self._control, self.host, self.control_port).start()
        await self._listen()

    async def close(self) -> None:
        """Stop listening and close the upstream connections."""
        await self._proxy.cleanup()
        await self._control.cleanup()
        if self._session is not None:
            await self._session.close()

    async def set_fault(self, fault: Fault) -> None:
        """Apply ``fault``: going down closes the port and cuts every open connection."""
        was_down, self.fault = self.fault.down, fault
        if fault.down and not was_down:
            assert self._site is not None
            await self._site.stop()
            self._site = None
            assert self._proxy.server is not None
            for connection in self._proxy.server.connections:  # idle keep-alives too
                if connection.transport is not None:
                    connection.transport.abort()
        elif was_down and not fault.down:
            await self._listen()

    async def _listen(self) -> None:
        self._site = web.TCPSite(self._proxy, self.host, self.port, reuse_address=True)
        await self._site.start()

    def _proxy_app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{path:.*}", self._forward)
        return app

    def _control_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/fault", self._get_fault)
        app.router.add_put("/fault", self._put_fault)
        return app

    async def _get_fault(self, _request: web.Request) -> web.Response:
        return web.json_response(
            dataclasses.asdict(self.fault)
            | {"requests": self.requests, "injected_errors": self.injected_errors}
        )

    async def _put_fault(self, request: web.Request) -> web.Response:
        try:
            fault = Fault.parse(await request.json())
        except ValueError as exc:  # json.JSONDecodeError is one too
            return web.json_response({"error": str(exc)}, status=400)
        await self.set_fault(fault)
        return web.json_response(dataclasses.asdict(fault))

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        fault = self.fault
        if fault.error_every and self.requests % fault.error_every == 0:
            self.injected_errors += 1
            body = b"" if request.method == "HEAD" else SLOW_DOWN
            return web.Response(status=503, body=body, content_type="application/xml")
        body = await request.read()
        if fault.delay_s:
            await asyncio.sleep(fault.delay_s)  # the fault itself: a slow server
        return await self._relay(request, body)

    async def _relay(self, request: web.Request, body: bytes) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self._session.request(
            request.method,
            self.upstream + request.rel_url.raw_path_qs,
            headers=headers,
            data=body,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            allow_redirects=False,
        ) as reply:
            payload = await reply.read()
            out = {k: v for k, v in reply.headers.items() if k.lower() not in HOP_HEADERS}
        length = int(out.pop("Content-Length", 0))
        if request.method != "HEAD":
            return web.Response(status=reply.status, headers=out, body=payload)
        # no body, but the Content-Length of the object it describes (S3 clients read it)
        head = web.StreamResponse(status=reply.status, headers=out)
        head.content_length = length
        await head.prepare(request)
        await head.write_eof()
        return head


async def _serve(proxy: FaultProxy) -> None:
    await proxy.start()
    click.echo(f"fault proxy: {proxy.host}:{proxy.port} -> {proxy.upstream}", err=True)
    try:
        await asyncio.Event().wait()  # until the benchmark stops this process
    finally:
        await proxy.close()


@click.command()
@click.option("--upstream", required=True, help="Base URL requests are forwarded to.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, required=True, help="Where the proxy listens.")
@click.option("--control-port", type=int, required=True, help="Where PUT /fault is answered.")
def main(upstream: str, host: str, port: int, control_port: int) -> None:
    """Forward HTTP to UPSTREAM, injecting the fault set over the control port."""
    asyncio.run(_serve(FaultProxy(upstream, host, port, control_port)))


if __name__ == "__main__":
    main()
