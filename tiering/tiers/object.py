"""L4: an S3-compatible object store: GETs through :mod:`tiering.tiers.s3_reader`, the rest
through ``aioboto3``.

Object names start with the first hex digits of the key (``<prefix><abc>/<key hex>.kvb``):
keys are hashes, so this spreads requests evenly over 4096 prefixes and stays under S3's
per-prefix request-rate limits. Concurrency is bounded by a semaphore (and a matching
connection pool). Throttling, 5xx and connection errors are retried with exponential
backoff (botocore's ``standard`` retry mode; for GETs the reader's own loop, with shorter
waits); connect and read timeouts bound each try.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aioboto3
from aiobotocore.session import AioSession
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from protocol.tiers import TierName
from tiering.codec import Block, CorruptBlock, decode, encode
from tiering.landing import Landed, Landing
from tiering.tiers.base import TierError, TierStats
from tiering.tiers.s3_reader import S3Reader, S3ReadError

_MISSING = ("404", "NoSuchKey", "NotFound")
_TRANSPORT_ERRORS = (BotoCoreError, OSError, TimeoutError)
_S3_ERRORS = (ClientError, *_TRANSPORT_ERRORS)


@dataclass(frozen=True)
class ObjectConfig:
    """Where the object store is and how hard to push it."""

    endpoint_url: str | None
    bucket: str
    prefix: str = "kv/"
    access_key: str | None = None
    secret_key: str | None = None
    region: str = "us-east-1"
    max_concurrency: int = 32
    #: total tries per request, first included (botocore ``standard`` retry mode)
    max_attempts: int = 4
    connect_timeout: float = 2.0
    read_timeout: float = 10.0


@dataclass(frozen=True)
class ObjectEntry:
    """One block found by :meth:`ObjectTier.scan`."""

    name: str
    key: bytes | None
    size: int
    mtime: float


class ObjectTier:
    """Blocks as objects in ``config.bucket`` under ``config.prefix``.

    Use as ``async with ObjectTier(cfg) as tier:`` (or call :meth:`start`/:meth:`close`): the
    client and its connection pool live as long as the tier.
    """

    name = TierName.OBJECT

    def __init__(self, config: ObjectConfig) -> None:
        self.config = config
        self._sem = asyncio.Semaphore(config.max_concurrency)
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None
        self.reader = S3Reader(config)
        self._stats = TierStats(self.name)

    async def start(self) -> ObjectTier:
        """Open the S3 client and the GET reader (idempotent; a failed start leaves none open)."""
        if self._client is None:
            c = self.config
            botocore_session = AioSession()
            session = aioboto3.Session(
                aws_access_key_id=c.access_key,
                aws_secret_access_key=c.secret_key,
                region_name=c.region,
                botocore_session=botocore_session,
            )
            boto_cfg = Config(
                retries={"mode": "standard", "total_max_attempts": c.max_attempts},
                connect_timeout=c.connect_timeout,
                read_timeout=c.read_timeout,
                max_pool_connections=c.max_concurrency,
            )
            try:
                client = await self._stack.enter_async_context(
                    session.client("s3", endpoint_url=c.endpoint_url, config=boto_cfg)
                )
                self._stack.push_async_callback(self.reader.close)
                await self.reader.start(
                    client.meta.endpoint_url,
                    await session.get_credentials(),
                    # may read ~/.aws/config: off the event loop
                    await asyncio.to_thread(botocore_session.get_config_variable, "ca_bundle"),
                )
            except BaseException:
                await self._stack.aclose()
                raise
            self._client = client
        return self

    async def close(self) -> None:
        """Close the client and its connections."""
        await self._stack.aclose()
        self._client = None

    async def __aenter__(self) -> ObjectTier:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def object_name(self, key: bytes) -> str:
        """The object name that holds ``key``."""
        h = key.hex()
        return f"{self.config.prefix}{h[:3]}/{h}.kvb"

    def _key_of(self, name: str) -> bytes | None:
        stem = name.rsplit("/", 1)[-1]
        if not stem.endswith(".kvb"):
            return None
        try:
            return bytes.fromhex(stem[:-4])
        except ValueError:
            return None

    def _fail(self, op: str, exc: Exception) -> TierError:
        return TierError(
            f"object: {op} on s3://{self.config.bucket}/{self.config.prefix} failed: {exc}"
        )

    # --- per-key operations -----------------------------------------------------------------
    async def _get_one(self, key: bytes) -> Block | None:
        name = self.object_name(key)
        async with self._sem:
            try:
                data = await self.reader.get(name)
            except (S3ReadError, *_TRANSPORT_ERRORS) as exc:
                raise self._fail("GET", exc) from exc
        if data is None:
            return None
        try:
            return decode(data, expect_key=key)
        except CorruptBlock:
            self._stats.corruptions += 1
            await self.delete_many([key])
            return None

    async def _put_one(self, block: Block) -> None:
        async with self._sem:
            try:
                await self._client.put_object(
                    Bucket=self.config.bucket, Key=self.object_name(block.key), Body=encode(block)
                )
            except _S3_ERRORS as exc:
                raise self._fail("PUT", exc) from exc

    async def _exists(self, key: bytes) -> bool:
        async with self._sem:
            try:
                await self._client.head_object(Bucket=self.config.bucket, Key=self.object_name(key))
                return True
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in _MISSING:
                    return False
                raise self._fail("HEAD", exc) from exc
            except _TRANSPORT_ERRORS as exc:
                raise self._fail("HEAD", exc) from exc

    # --- the Tier interface -------------------------------------------------------------------
    async def get_many(self, keys: Sequence[bytes]) -> list[Block | None]:
        await self.start()
        return list(await asyncio.gather(*(self._get_counted(k) for k in keys)))

    async def land(self, keys: Sequence[bytes], into: Landing, at: Sequence[int]) -> list[Landed]:
        """Each page is copied into ``into`` as soon as its GET is verified, while the
        others are still in flight, instead of all of them once the last has arrived."""
        await self.start()

        async def one(key: bytes, i: int) -> Landed:
            block = await self._get_counted(key)
            return Landed.MISSING if block is None else into.fill(i, block)

        return list(await asyncio.gather(*(one(k, i) for k, i in zip(keys, at, strict=True))))

    async def _get_counted(self, key: bytes) -> Block | None:
        return self._stats.count_read(await self._get_one(key))

    async def put_many(self, blocks: Sequence[Block]) -> None:
        await self.start()
        await asyncio.gather(*(self._put_one(b) for b in blocks))
        self._stats.puts += len(blocks)
        self._stats.bytes_written += sum(b.nbytes for b in blocks)

    async def longest_prefix(self, keys: Sequence[bytes]) -> int:
        await self.start()
        step = self.config.max_concurrency
        for i in range(0, len(keys), step):
            present = await asyncio.gather(*(self._exists(k) for k in keys[i : i + step]))
            for j, ok in enumerate(present):
                if not ok:
                    return i + j
        return len(keys)

    async def present(self, keys: Sequence[bytes]) -> set[bytes]:
        """Which of ``keys`` exist (a HEAD each, nothing read): tierd checks a ledger row's
        object bit this way before deleting the page's last other copy."""
        await self.start()
        found = await asyncio.gather(*(self._exists(k) for k in keys))
        return {k for k, ok in zip(keys, found, strict=True) if ok}

    async def delete_many(self, keys: Sequence[bytes]) -> None:
        await self.delete_names([self.object_name(k) for k in keys])

    async def delete_names(self, names: Sequence[str]) -> None:
        """Delete objects by name (also orphans found by :meth:`scan`)."""
        await self.start()
        for i in range(0, len(names), 1000):  # DeleteObjects takes at most 1000 names
            objects = [{"Key": n} for n in names[i : i + 1000]]
            try:
                await self._client.delete_objects(
                    Bucket=self.config.bucket, Delete={"Objects": objects, "Quiet": True}
                )
            except _S3_ERRORS as exc:
                raise self._fail("DELETE", exc) from exc
            self._stats.deletes += len(objects)

    async def scan(self) -> AsyncIterator[ObjectEntry]:
        """Every object under the prefix (for tierd's reconciliation)."""
        await self.start()
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            async for page in paginator.paginate(
                Bucket=self.config.bucket, Prefix=self.config.prefix
            ):
                for obj in page.get("Contents", []):
                    yield ObjectEntry(
                        obj["Key"],
                        self._key_of(obj["Key"]),
                        int(obj["Size"]),
                        obj["LastModified"].timestamp(),
                    )
        except _S3_ERRORS as exc:
            raise self._fail("LIST", exc) from exc

    def stats(self) -> TierStats:
        return self._stats.snapshot()
