"""The official ``openai`` client through the gateway to built-in workers.

Two real ``kvgate worker --model tiny-random`` processes (the built-in torch engine with a
seeded tiny random Llama on CPU) behind one gateway process; chat and text completions,
streaming and not.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import asyncpg
import openai
import pytest

from kvgate.stack.ports import free_port
from tests.support.gateway import (
    KVGATE,
    apoll,
    deregister,
    gateway_process,
    process,
    register_workers,
    team_key,
    unique,
    wait_http,
)

MODEL = "tiny-random"


@contextlib.contextmanager
def builtin_worker() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A ``kvgate worker --model tiny-random`` process, started but not yet ready."""
    port = free_port()
    args = [*KVGATE, "worker"]
    args += ["--model", MODEL, "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    env = {"KVGATE_HOME": f"/tmp/kvgate-gw-{port}"}
    with process(args, url + "/v1/models", env, wait=False) as proc:
        yield url, proc


@dataclass
class Rig:
    client: openai.OpenAI
    team_id: int


@pytest.fixture(scope="module")
async def rig(pg_dsn: str, pg_pool: asyncpg.Pool) -> AsyncIterator[Rig]:
    ids = [unique("w-builtin") for _ in range(2)]
    # Other test modules may have registered tiny-random workers; this test owns the model
    # name while it runs, so earlier leftovers are cleared first.
    await pg_pool.execute("DELETE FROM workers WHERE model = $1", MODEL)
    with contextlib.ExitStack() as stack:
        started = {i: stack.enter_context(builtin_worker()) for i in ids}
        for url, proc in started.values():
            # Loading torch and building the engine takes a while on a shared CPU.
            wait_http(url + "/v1/models", 180, proc=proc)
        urls = {i: url for i, (url, _) in started.items()}
        await register_workers(pg_pool, MODEL, urls)
        team_id, key = await team_key(pg_pool)
        gw, _ = stack.enter_context(gateway_process(pg_dsn))
        client = openai.OpenAI(base_url=gw + "/v1", api_key=key, max_retries=0, timeout=60)
        yield Rig(client, team_id)
    await deregister(pg_pool, ids)


def test_models_lists_the_builtin_model(rig: Rig) -> None:
    assert MODEL in [m.id for m in rig.client.models.list()]


def test_chat_and_completions_not_streaming(rig: Rig) -> None:
    chat = rig.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=4,
        temperature=0,
        seed=1,
    )
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens == 4 and chat.usage.prompt_tokens > 0
    text = rig.client.completions.create(model=MODEL, prompt="Once upon", max_tokens=3)
    assert text.usage.completion_tokens == 3 and isinstance(text.choices[0].text, str)


def test_chat_and_completions_streaming(rig: Rig) -> None:
    chunks = list(
        rig.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count."}],
            max_tokens=5,
            stream=True,
            extra_body={"min_tokens": 5, "top_k": 3},
        )
    )
    assert chunks and all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"

    chunks = list(
        rig.client.completions.create(
            model=MODEL,
            prompt="Once upon",
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert sum(1 for c in chunks if c.choices) == 3


async def test_usage_rows_record_the_workers_token_counts(rig: Rig, pg_pool: asyncpg.Pool) -> None:
    rig.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2, stream=True
    )
    rows = await apoll(
        lambda: pg_pool.fetch(
            "SELECT completion_tokens, prompt_tokens, worker FROM usage WHERE team_id = $1",
            rig.team_id,
        ),
        lambda rows: len(rows) >= 5,
        what="usage rows of this module's requests",
    )
    assert all(r["prompt_tokens"] > 0 and r["worker"].startswith("w-builtin") for r in rows)
    assert sorted(r["completion_tokens"] for r in rows) == [2, 3, 3, 4, 5]
