"""A fuzz of the public API from its own OpenAPI document (schemathesis, seeded and bounded).

Bodies that follow the document and bodies that break it go to a real gateway process (a
stub upstream behind it, so a well-formed request may also succeed): no answer is a 5xx,
and every answer has a status code, content type and body the document describes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.openapi import document
from tests.support.gateway import (
    deregister,
    gateway_process,
    register_workers,
    stub_upstream,
    unique,
)

SCHEMA = schemathesis.openapi.from_dict(document())
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
async def gateway_url(pg_dsn: str, pg_pool: asyncpg.Pool) -> AsyncIterator[str]:
    with stub_upstream("w-fuzz") as (upstream, _):
        worker = unique("w-fuzz")
        await register_workers(pg_pool, "fuzz-model", {worker: upstream})
        # a free tier without limits worth reaching, so the fuzz meets validation, not 429s
        with gateway_process(pg_dsn) as (url, _):
            yield url
        await deregister(pg_pool, [worker])


@SCHEMA.parametrize()
@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_the_api_answers_every_generated_request_as_its_document_says(
    case: schemathesis.Case, gateway_url: str
) -> None:
    case.call_and_validate(base_url=gateway_url, checks=CHECKS)
