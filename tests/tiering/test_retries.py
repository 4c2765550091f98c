"""The object tier retries S3 throttling and 5xx with backoff, then gives up as a tier failure.

A small reverse proxy (:class:`tests.support.tiering.ThrottlingProxy`) in front of the real
SeaweedFS answers the first requests with an S3 error reply (``503 SlowDown`` unless a test
picks another) and forwards the rest unchanged, so the retries run against real HTTP
errors and then real S3 responses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from kvgate.stack.seaweed import S3Endpoint
from tests.support.tiering import (
    ThrottlingProxy,
    chain,
    namespace,
    object_config,
    s3_error,
    serving,
)
from tiering.tiers.base import TierError
from tiering.tiers.object import ObjectTier


@pytest.fixture
async def proxy(s3_server: S3Endpoint) -> AsyncIterator[tuple[ThrottlingProxy, str]]:
    throttle = ThrottlingProxy(s3_server.url, refuse=0)
    async with serving(throttle) as url:
        yield throttle, url


@pytest.mark.parametrize(
    ("status", "code"), [(503, "SlowDown"), (500, "InternalError"), (400, "RequestTimeout")]
)
async def test_throttled_reads_are_retried_until_they_succeed(
    s3_server, proxy, status: int, code: str
) -> None:
    throttle, url = proxy
    cfg = object_config(s3_server, max_attempts=4)
    blocks = chain(namespace(), 1)
    async with ObjectTier(cfg) as direct:
        await direct.put_many(blocks)
    throttle.refuse, throttle.reply = 2, (status, s3_error(code), {})
    async with ObjectTier(replace(cfg, endpoint_url=url)) as tier:
        (got,) = await tier.get_many([blocks[0].key])
    assert got is not None and bytes(got.payload) == bytes(blocks[0].payload)
    assert throttle.seen == 3  # two refusals, then the real answer


async def test_throttling_beyond_the_retry_budget_is_a_tier_error(s3_server, proxy) -> None:
    throttle, url = proxy
    throttle.refuse = 100
    cfg = replace(object_config(s3_server, max_attempts=2), endpoint_url=url)
    async with ObjectTier(cfg) as tier:
        with pytest.raises(TierError, match=r"SlowDown|503"):
            await tier.get_many([chain(namespace(), 1)[0].key])
    assert throttle.seen == 2


async def test_a_refused_read_is_not_retried_and_names_s3s_error_code(s3_server, proxy) -> None:
    throttle, url = proxy
    cfg = replace(object_config(s3_server, max_attempts=4), endpoint_url=url, secret_key="wrong")
    async with ObjectTier(cfg) as tier:
        with pytest.raises(TierError, match=r"GET .* HTTP 403 \(SignatureDoesNotMatch\)"):
            await tier.get_many([chain(namespace(), 1)[0].key])
    assert throttle.seen == 1  # a refusal is an answer: no second try


async def test_a_redirect_is_reported_not_followed(s3_server, proxy) -> None:
    throttle, url = proxy
    throttle.refuse = 100
    moved = {"Location": "http://127.0.0.1:9/elsewhere"}  # a port nothing listens on
    throttle.reply = (307, s3_error("TemporaryRedirect"), moved)
    cfg = replace(object_config(s3_server, max_attempts=4), endpoint_url=url)
    async with ObjectTier(cfg) as tier:
        with pytest.raises(TierError, match=r"HTTP 307 \(TemporaryRedirect\)"):
            await tier.get_many([chain(namespace(), 1)[0].key])
    assert throttle.seen == 1
