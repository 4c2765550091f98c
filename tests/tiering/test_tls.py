"""An object store behind HTTPS with a private CA: restores trust the CA bundle botocore is
given (``AWS_CA_BUNDLE``), and no certificate outside the system's and that bundle.

A TLS-terminating proxy (certificates from ``trustme``) forwards to the real SeaweedFS.
Restores take their own HTTP path (:mod:`tiering.tiers.s3_reader`), so without the bundle
they would fail verification where aiobotocore's requests succeed.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import trustme

from kvgate.stack.seaweed import S3Endpoint
from tests.support.tiering import ThrottlingProxy, chain, namespace, object_config, serving
from tiering.tiers.base import TierError
from tiering.tiers.object import ObjectTier


@pytest.fixture
async def https_s3(s3_server: S3Endpoint, tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """SeaweedFS behind HTTPS; yields the URL and the PEM file of the CA that signed it."""
    ca = trustme.CA()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(tls)
    bundle = tmp_path / "private-ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    async with serving(ThrottlingProxy(s3_server.url, refuse=0), tls) as url:
        yield url, bundle


async def test_restores_trust_the_ca_bundle_botocore_is_given(
    s3_server: S3Endpoint, https_s3: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, bundle = https_s3
    monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
    blocks = chain(namespace(), 3)
    cfg = object_config(s3_server)
    # written straight to SeaweedFS: the proxy forwards simple requests, not aws-chunked PUTs
    async with ObjectTier(cfg) as direct:
        await direct.put_many(blocks)
    async with ObjectTier(replace(cfg, endpoint_url=url)) as tier:
        got = await tier.get_many([b.key for b in blocks])
    assert [bytes(g.payload) for g in got if g is not None] == [bytes(b.payload) for b in blocks]


async def test_an_untrusted_endpoint_is_refused(
    s3_server: S3Endpoint, https_s3: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = https_s3
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
    cfg = replace(object_config(s3_server, max_attempts=1), endpoint_url=url)
    async with ObjectTier(cfg) as tier:
        with pytest.raises(TierError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify"):
            await tier.get_many([chain(namespace(), 1)[0].key])
