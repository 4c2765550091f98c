"""Helpers shared by the tiering tests: deterministic blocks and tier factories."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import asyncpg
import numpy as np
from aiohttp import web

from kvgate.stack.seaweed import S3Endpoint
from migrations import runner
from tiering.codec import Block, make_block
from tiering.keys import Namespace
from tiering.tiers.object import ObjectConfig


def namespace(tenant: str = "tenant", page_size: int = 4) -> Namespace:
    """A namespace unique to the calling test (random model fingerprint)."""
    return Namespace(
        tenant=tenant, model=f"m-{uuid.uuid4().hex}", dtype="float16", page_size=page_size
    )


def chain(ns: Namespace, n_pages: int, *, elems: int = 256, first_token: int = 0) -> list[Block]:
    """``n_pages`` chained blocks in ``ns`` with deterministic float16 payloads."""
    ids = list(range(first_token, first_token + n_pages * ns.page_size))
    blocks = []
    for i, key in enumerate(ns.page_keys(ids)):
        arr = (
            np.random.default_rng(first_token * 1000 + i).standard_normal(elems).astype(np.float16)
        )
        blocks.append(make_block(key, ns.digest, "float16", (elems,), arr))
    return blocks


def flip_byte(path: Path, at: int = -1) -> None:
    """Damage the file at ``path``: one bit of byte ``at`` flipped, as storage rot would."""
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x01
    path.write_bytes(raw)


def object_config(endpoint: S3Endpoint, **kw: object) -> ObjectConfig:
    """An object-tier config on the test S3 server, under a prefix unique to the caller."""
    return ObjectConfig(
        endpoint_url=endpoint.url,
        bucket="kvtest",
        prefix=f"t-{uuid.uuid4().hex[:12]}/",
        access_key=endpoint.access_key,
        secret_key=endpoint.secret_key,
        region=endpoint.region,
        **kw,  # type: ignore[arg-type]
    )


@contextlib.asynccontextmanager
async def fresh_database(pg_dsn: str) -> AsyncIterator[str]:
    """A new, migrated database on the session server (dropped afterwards); yields its name.

    tierd reconciles the whole ledger against one NAS and one bucket prefix, so tests that
    run it need a ledger of their own.
    """
    name = f"kv_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        conn = await asyncpg.connect(pg_dsn, database=name)
        try:
            await runner.migrate(conn)
        finally:
            await conn.close()
        yield name
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """Make ``path`` read-only for this process: a read-only bind mount as root, else chmod."""
    if os.geteuid() == 0:
        subprocess.run(["mount", "--bind", "-o", "ro", str(path), str(path)], check=True)
        try:
            yield
        finally:
            subprocess.run(["umount", str(path)], check=True)
    else:
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(0o755)


def s3_error(code: str) -> str:
    """An S3 error body carrying ``code``."""
    return f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code></Error>'


class ThrottlingProxy:
    """Forwards to ``upstream`` after refusing the first ``refuse`` requests with ``reply``;
    a request whose path contains one of ``held`` waits for ``release`` first."""

    def __init__(self, upstream: str, refuse: int) -> None:
        self.upstream = upstream
        self.refuse = refuse
        self.reply: tuple[int, str, dict[str, str]] = (503, s3_error("SlowDown"), {})
        self.seen = 0
        self.held: set[str] = set()
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen += 1
        if any(part in request.path for part in self.held):
            await self.release.wait()
        if self.seen <= self.refuse:
            status, text, headers = self.reply
            return web.Response(
                status=status, text=text, headers=headers, content_type="application/xml"
            )
        body = await request.read()
        # Host is forwarded unchanged: it is part of the SigV4 signature
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.request(
                request.method,
                self.upstream + request.rel_url.raw_path_qs,
                headers=request.headers,
                data=body,
            ) as resp,
        ):
            payload = await resp.read()
            headers = {
                k: v
                for k, v in resp.headers.items()
                if k.lower() not in ("transfer-encoding", "content-length", "connection")
            }
            return web.Response(status=resp.status, body=payload, headers=headers)


@contextlib.asynccontextmanager
async def serving(proxy: ThrottlingProxy, tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """``proxy`` listening on a free local port (over TLS with ``tls``); yields its URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    app_runner = web.AppRunner(app)
    await app_runner.setup()
    site = web.TCPSite(app_runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        await app_runner.cleanup()
