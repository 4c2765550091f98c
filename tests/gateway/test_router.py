"""Routing: conversations stay on their worker while no worker exceeds 1.25x the mean.

Three stub upstreams (OpenAI-shaped stand-ins, not models) hold every request until the
test releases them, so all ten conversations of a round are in flight at once and the
gateway's load bound is what decides where they go.
"""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
import httpx

from tests.support.gateway import (
    apoll,
    deregister,
    gateway_process,
    register_workers,
    stub_upstream,
    team_key,
    unique,
)

CONVERSATIONS = 10
TURNS = 5


async def test_ten_conversations_five_turns_three_workers(
    pg_dsn: str, pg_pool: asyncpg.Pool
) -> None:
    model = unique("m-route")
    ids = [unique("w-route") for _ in range(3)]
    with contextlib.ExitStack() as stack:
        urls = {i: stack.enter_context(stub_upstream(i, "--hold"))[0] for i in ids}
        await register_workers(pg_pool, model, urls)
        _, key = await team_key(pg_pool)
        gw, _ = stack.enter_context(gateway_process(pg_dsn))
        served: list[list[str]] = [[] for _ in range(CONVERSATIONS)]
        peak_share: list[float] = []
        async with httpx.AsyncClient(timeout=30) as client:

            async def stats() -> dict[str, int]:
                out = {}
                for worker_id, url in urls.items():
                    out[worker_id] = (await client.get(url + "/control/stats")).json()["inflight"]
                return out

            for turn in range(TURNS):
                calls = [
                    client.post(
                        gw + "/v1/chat/completions",
                        headers={"authorization": f"Bearer {key}"},
                        json={"model": model, "max_tokens": 2, "messages": _history(c, turn)},
                    )
                    for c in range(CONVERSATIONS)
                ]
                pending = asyncio.gather(*calls)
                load = await apoll(stats, lambda s: sum(s.values()) == CONVERSATIONS)
                peak_share.append(max(load.values()) / (CONVERSATIONS / len(ids)))
                for url in urls.values():
                    await client.post(url + "/control/release")
                for c, response in enumerate(await pending):
                    assert response.status_code == 200, response.text
                    served[c].append(response.json()["id"].removeprefix("cmpl-stub-"))
        await deregister(pg_pool, ids)

    follow_ups = [w == turns[0] for turns in served for w in turns[1:]]
    assert sum(follow_ups) / len(follow_ups) >= 0.9, served
    assert max(peak_share) <= 1.25, peak_share
    per_worker = [sum(t.count(i) for t in served) for i in ids]
    assert max(per_worker) <= 1.25 * (CONVERSATIONS * TURNS / len(ids)), per_worker


def _history(conversation: int, turn: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are terse."}]
    for t in range(turn + 1):
        messages.append({"role": "user", "content": f"conversation {conversation} turn {t}"})
        if t < turn:
            messages.append({"role": "assistant", "content": "xx"})
    return messages
