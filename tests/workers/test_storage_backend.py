"""``/hicache/storage-backend`` on the built-in worker, as SGLang has it: the tiers below the
device pool are detached and attached again at runtime, only while the worker is idle.

Detached, the worker neither hands pages down nor restores them (a flushed prefix is
recomputed, to the same output); attached again, both resume, and what the tiers held
before the detach is served again. Bad bodies are 400s, a worker without tiers cannot
attach any (409), and cold storage waits for the tiers to be attached (409)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.worker import cached_by_tier, greedy_turn, tiered_tiny_engine, worker_app
from workers.engine.api import GenerateRequest, SamplingParams
from workers.engine.engine import TorchEngine

PAGE = 16
ROUTE = "/hicache/storage-backend"
ATTACH = {"hicache_storage_backend": "kvgate"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TorchEngine]:
    """A tiny engine over host RAM and a NAS directory (no ledger, no object store)."""
    with tiered_tiny_engine(tmp_path_factory.mktemp("backend-nas")) as engine:
        yield engine


@pytest.fixture
async def client(engine: TorchEngine, smollm2_gguf: Path) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the worker app; the tiers are attached again when the test ends."""
    transport = httpx.ASGITransport(worker_app(engine, smollm2_gguf))
    async with httpx.AsyncClient(transport=transport, base_url="http://w") as c:
        yield c
    assert engine.attach_tiers(True)


async def _flush(c: httpx.AsyncClient) -> None:
    assert (await c.post("/flush_cache")).status_code == 200


async def test_detached_tiers_neither_take_nor_give_pages_and_attached_they_do_again(
    client: httpx.AsyncClient,
) -> None:
    c, salt = client, f"s-{uuid.uuid4().hex}"
    kept, unseen = list(range(3000, 3100)), list(range(6000, 6100))  # 6 full pages each
    first = await greedy_turn(c, kept, salt)  # attached: its pages go down (write-through)

    reply = await c.delete(ROUTE)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"hicache_storage_backend": None, "configured": "kvgate"}
    assert (await c.get(ROUTE)).json()["hicache_storage_backend"] is None
    await greedy_turn(c, unseen, salt)  # detached: its pages stay on the device alone
    await _flush(c)
    recomputed = await greedy_turn(c, kept, salt)
    assert recomputed["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert recomputed["choices"][0]["text"] == first["choices"][0]["text"]

    reply = await c.put(ROUTE, json=ATTACH)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"hicache_storage_backend": "kvgate", "configured": "kvgate"}
    await _flush(c)
    restored = await greedy_turn(c, kept, salt)
    assert cached_by_tier(restored)["host"] == 6 * PAGE, (
        "what the tiers held before is served again"
    )
    assert restored["choices"][0]["text"] == first["choices"][0]["text"]
    never_offered = await greedy_turn(c, unseen, salt)
    assert never_offered["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_the_tiers_stay_as_they_are_while_a_request_runs(
    engine: TorchEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After its first token the request is held: the engine's steps do nothing until the
    # test lets it go, so it is still running when the test asks, however fast the model.
    held, real_step = threading.Event(), engine.scheduler.step
    released = threading.Event()

    def step() -> None:
        if not held.is_set():
            real_step()
            held.set()
        elif released.is_set():
            real_step()

    monkeypatch.setattr(engine.scheduler, "step", step)
    request = GenerateRequest(
        rid=f"busy-{uuid.uuid4().hex}",
        input_ids=tuple(range(100, 140)),
        sampling=SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
    )
    stream = engine.generate(request)
    await anext(stream)  # running now
    assert engine.attach_tiers(False) is False
    assert engine.tiers_attached
    released.set()
    assert [event.finish_reason async for event in stream][-1] == "length"
    assert engine.attach_tiers(True), "idle again, the worker takes the change"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"hicache_storage_backend": "mooncake"}, "hicache_storage_backend"),
        ({}, "hicache_storage_backend"),
        (
            {**ATTACH, "hicache_storage_prefetch_policy": "timeout"},
            "hicache_storage_prefetch_policy",
        ),
    ],
)
async def test_a_bad_attach_body_is_a_400_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, Any], param: str
) -> None:
    assert (await client.delete(ROUTE)).status_code == 200
    reply = await client.put(ROUTE, json=body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
    assert (await client.get(ROUTE)).json()["hicache_storage_backend"] is None, "state changed"


async def test_cold_storage_waits_for_the_tiers_to_be_attached(client: httpx.AsyncClient) -> None:
    assert (await client.delete(ROUTE)).status_code == 200
    reply = await client.post("/cold_storage", json={"cache_salt": "s", "tier": "nas"})
    assert reply.status_code == 409
    assert "detached" in reply.json()["error"]["message"]


async def test_a_worker_without_tiers_has_none_to_attach(worker_client: httpx.AsyncClient) -> None:
    state = {"hicache_storage_backend": None, "configured": None}
    assert (await worker_client.get(ROUTE)).json() == state
    reply = await worker_client.put(ROUTE, json=ATTACH)
    assert reply.status_code == 409
    assert "without tiers" in reply.json()["error"]["message"]
    assert (await worker_client.delete(ROUTE)).json() == state  # detaching is idempotent
