"""``POST /cold_storage`` on the built-in worker: one cache namespace's pages leave the
device and host RAM for the NAS or the object store, and the next turn restores them from
there with the output a recompute gives; another namespace's pages stay where they were.
Bad bodies are 400s naming the field; a worker without lower tiers answers 409."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvgate.stack.seaweed import S3Endpoint
from tests.support.tiering import object_config
from tests.support.worker import cached_by_tier, greedy_turn, tiered_tiny_engine, worker_app

PAGE = 16


@pytest.fixture(scope="module")
async def tiered(
    pg_dsn: str, s3_server: S3Endpoint, smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[httpx.AsyncClient, Path]]:
    """A client of the worker app over a tiered tiny engine (NAS, ledger, object store),
    and its NAS directory; each test uses namespaces of its own."""
    nas = tmp_path_factory.mktemp("cold-storage-nas")
    with tiered_tiny_engine(nas, dsn=pg_dsn, s3=object_config(s3_server)) as engine:
        transport = httpx.ASGITransport(worker_app(engine, smollm2_gguf))
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as client:
            yield client, nas


async def _send_down(client: httpx.AsyncClient, salt: str, tier: str) -> dict[str, Any]:
    reply = await client.post("/cold_storage", json={"cache_salt": salt, "tier": tier})
    assert reply.status_code == 200, reply.text
    return reply.json()


async def test_a_namespace_sent_to_the_nas_then_the_object_store_comes_back_from_each(
    tiered: tuple[httpx.AsyncClient, Path],
) -> None:
    c, nas_dir = tiered
    mine, theirs = f"visitor-{uuid.uuid4().hex}", f"other-{uuid.uuid4().hex}"
    prompt = list(range(3000, 3100))  # 6 full pages; the 7th is recomputed for its logits
    other = list(range(5000, 5100))
    resident = 6 * PAGE
    first = await greedy_turn(c, prompt, mine)
    await greedy_turn(c, other, theirs)

    sent = await _send_down(c, mine, "nas")
    assert sent["tier"] == "nas"
    assert sent["device_pages"] >= 6 and sent["pinned_pages"] == 0
    assert sent["pages"] >= sent["device_pages"]
    assert list(nas_dir.rglob("*")), "nothing was written to the NAS"

    from_nas = await greedy_turn(c, prompt, mine)
    assert cached_by_tier(from_nas) == {"device": 0, "host": 0, "nas": resident, "object": 0}
    assert from_nas["choices"][0]["text"] == first["choices"][0]["text"]
    # the other namespace was not touched: still on the device
    assert cached_by_tier(await greedy_turn(c, other, theirs))["device"] == resident

    sent = await _send_down(c, mine, "object")
    assert sent["tier"] == "object" and sent["nas_pages"] >= 6

    from_object = await greedy_turn(c, prompt, mine)
    assert cached_by_tier(from_object) == {"device": 0, "host": 0, "nas": 0, "object": resident}
    assert from_object["choices"][0]["text"] == first["choices"][0]["text"]

    info = (await c.get("/server_info")).json()
    assert info["prefill_tokens_per_s"] > 0


async def test_moves_while_the_conversation_is_being_served_change_no_answer(
    tiered: tuple[httpx.AsyncClient, Path],
) -> None:
    c, _ = tiered
    salt = f"busy-{uuid.uuid4().hex}"
    prompt = list(range(7000, 7090))
    # the same tokens computed cold, in a namespace nothing moves
    expected = (await greedy_turn(c, prompt, f"cold-{uuid.uuid4().hex}"))["choices"][0]
    await greedy_turn(c, prompt, salt)  # cached: the turns below pin these pages

    served = asyncio.gather(*(greedy_turn(c, prompt, salt) for _ in range(9)))
    moves = []
    while not served.done():  # move the conversation again and again while it is served
        moves.append(await _send_down(c, salt, "nas"))
    answers = await served
    assert [a["choices"][0]["text"] for a in answers] == [expected["text"]] * 9
    assert moves and all(m["pages"] >= m["device_pages"] for m in moves)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"cache_salt": "s", "tier": "tape"}, "tier"),
        ({"cache_salt": "s"}, "tier"),
        ({"tier": "nas"}, "cache_salt"),
        ({"cache_salt": "s" * 257, "tier": "nas"}, "cache_salt"),
        ({"cache_salt": "s", "tier": "nas", "everyone": True}, "everyone"),
    ],
)
async def test_a_bad_body_is_a_400_naming_the_field(
    worker_client: httpx.AsyncClient, body: dict[str, Any], param: str
) -> None:
    reply = await worker_client.post("/cold_storage", json=body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


async def test_not_json_is_a_400(worker_client: httpx.AsyncClient) -> None:
    reply = await worker_client.post("/cold_storage", content=b"tier=nas")
    assert reply.status_code == 400
    assert "not valid JSON" in reply.json()["error"]["message"]


async def test_a_worker_without_lower_tiers_answers_409(worker_client: httpx.AsyncClient) -> None:
    reply = await worker_client.post("/cold_storage", json={"cache_salt": "s", "tier": "nas"})
    assert reply.status_code == 409
    assert "no tiers below" in reply.json()["error"]["message"]
