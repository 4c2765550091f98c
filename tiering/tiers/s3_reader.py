"""Signed S3 GETs on the restore path: botocore's SigV4 signer over an aiohttp pool.

A restore reads a few hundred pages of a few hundred KiB each, and every millisecond of
client CPU per request comes off the restore rate. aiobotocore spends about 1 ms of CPU on
each GET (its event hooks, response parsing and body wrapper); on this project's 2-core
test machine that halved what SeaweedFS could serve: plain GETs of 720 KiB objects ran at
0.47 GB/s through aiobotocore and at 0.85 GB/s signed by botocore (0.07 ms each) and sent
by aiohttp. So the object tier reads through this module and keeps aiobotocore for
everything else (PUT, HEAD, DELETE, LIST), where its completeness matters more than its
speed.

Retries cover what botocore's ``standard`` mode retries on a GET: throttling (429, 503
SlowDown), other 5xx, ``400 RequestTimeout``, connection errors and timeouts, up to
``max_attempts`` tries in all. The backoff is deliberately shorter than botocore's (full
jitter under 50 ms, doubling, capped at 2 s, where botocore starts at 1 s): a restore
runs under a deadline of a fraction of a second, past which recomputing is cheaper than
waiting. A 404 is an answer (absent), not an error; redirects are not followed, so a
bucket in another region is reported as such rather than as a failed signature. HTTPS
trusts the CA bundle botocore is given (``AWS_CA_BUNDLE``). Proxies
from the environment are not used: aiohttp's ``trust_env`` re-reads them on every
request, which cost a fifth of the rate here, and KV traffic belongs on the direct path.
"""

from __future__ import annotations

import asyncio
import random
import re
import ssl
from typing import TYPE_CHECKING
from urllib.parse import quote

import aiohttp
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from yarl import URL

if TYPE_CHECKING:
    from aiobotocore.credentials import AioCredentials

    # import cycle: the type only; the object tier builds its reader from this config
    from tiering.tiers.object import ObjectConfig

#: statuses worth another try: throttling and server-side failures
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: error codes worth another try whatever the status (S3 sends RequestTimeout with a 400)
RETRY_CODES = frozenset({"RequestTimeout", "SlowDown", "Throttling"})
#: first backoff ceiling and the cap, seconds (full jitter: a uniform draw below the ceiling)
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 2.0
_ERROR_CODE = re.compile(rb"<Code>([^<]{1,64})</Code>")


class S3ReadError(Exception):
    """A GET that failed for good: a refusal (403, 400, 3xx, ...) or every try used up."""


class S3Reader:
    """GETs of whole objects from ``config.bucket``, path-style under the client's endpoint.

    :meth:`start` takes the endpoint and the credentials that the tier's aiobotocore client
    resolved (so both sides agree on where and who), and must run inside the event loop
    that will use the reader; :meth:`close` ends its connection pool.
    """

    def __init__(self, config: ObjectConfig) -> None:
        self.config = config
        self._base = ""
        self._credentials: AioCredentials | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(
        self, endpoint_url: str, credentials: AioCredentials | None, ca_bundle: str | None = None
    ) -> None:
        """Open the connection pool (idempotent). ``credentials``: aiobotocore's, refreshed
        as they expire; ``None`` sends unsigned requests (a public bucket). ``ca_bundle``:
        the certificates botocore trusts (``AWS_CA_BUNDLE``, ``ca_bundle`` in the AWS
        config), so that an HTTPS endpoint behind a private CA serves GETs as it serves
        the client's PUTs; ``None`` trusts the system's."""
        if self._session is not None:
            return
        c = self.config
        self._base = f"{endpoint_url.rstrip('/')}/{quote(c.bucket, safe='')}/"
        self._credentials = credentials
        tls = ssl.create_default_context(cafile=ca_bundle) if ca_bundle else True
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=c.max_concurrency, ssl=tls),
            timeout=aiohttp.ClientTimeout(sock_connect=c.connect_timeout, sock_read=c.read_timeout),
            auto_decompress=False,
        )

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def url(self, name: str) -> str:
        """The path-style URL of object ``name``, percent-encoded as it is signed and sent."""
        return self._base + quote(name, safe="/~")

    async def _headers(self, url: str) -> dict[str, str]:
        if self._credentials is None:
            return {}
        request = AWSRequest(method="GET", url=url)
        frozen = await self._credentials.get_frozen_credentials()
        S3SigV4Auth(frozen, "s3", self.config.region).add_auth(request)
        return dict(request.headers)

    async def get(self, name: str) -> bytes | None:
        """The body of object ``name``, or ``None`` where there is no such object."""
        if self._session is None:
            raise RuntimeError("S3Reader.start() was not awaited")
        url = self.url(name)
        attempts = max(1, self.config.max_attempts)
        tries = 0
        while True:
            tries += 1
            try:
                async with self._session.get(
                    URL(url, encoded=True),  # sent exactly as signed: no re-quoting
                    headers=await self._headers(url),
                    allow_redirects=False,
                ) as resp:
                    if resp.status == 200:
                        return await resp.read()
                    if resp.status == 404:
                        return None
                    body = await resp.read()
                    code = _error_code(body)
                    retry = resp.status in RETRY_STATUSES or code in RETRY_CODES
                    if not retry or tries >= attempts:
                        raise S3ReadError(f"HTTP {resp.status}" + (f" ({code})" if code else ""))
            except (aiohttp.ClientError, TimeoutError) as exc:
                if tries >= attempts:
                    raise S3ReadError(f"{type(exc).__name__}: {exc}") from exc
            ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (tries - 1))
            await asyncio.sleep(random.uniform(0, ceiling))


def _error_code(body: bytes) -> str:
    """S3's error code from an XML error body (``SignatureDoesNotMatch``), or ``""``."""
    found = _ERROR_CODE.search(body[:4096])
    return found.group(1).decode(errors="replace") if found else ""
