"""`kvgate worker` as a process: announces readiness, serves, drains on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import httpx

KVGATE = str(Path(sys.executable).parent / "kvgate")


async def test_worker_serves_and_finishes_running_requests_on_sigterm(
    smollm2_gguf: Path, nas_dir: Path
) -> None:
    # tiny-random borrows SmolLM2's tokenizer: point the models dir at the test cache.
    env = {
        **os.environ,
        "KVGATE_HOME": str(smollm2_gguf.parent.parent),
        "KVGATE_NAS_PATH": str(nas_dir),
    }
    proc = await asyncio.create_subprocess_exec(
        KVGATE, "worker", "--model", "tiny-random", "--port", "0", "--kv-pool-bytes", "4000000",
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=120)).decode()
        assert line.startswith("worker ready at http://127.0.0.1:"), line
        url, model = line.split()[3], line.split()[4]
        assert model == "model=tiny-random"
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            assert (await client.get("/health")).text == "ok"
            assert (await client.get("/server_info")).json()["tiers"] is True
            body = {
                "model": "tiny-random",
                "messages": [{"role": "user", "content": "Count to ten."}],
                "max_tokens": 64,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
            }
            events = []
            async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
                async for event in resp.aiter_lines():
                    if not event.startswith("data: "):
                        continue
                    events.append(event[len("data: ") :])
                    if len(events) == 2:
                        proc.send_signal(signal.SIGTERM)  # mid-stream: it must still finish
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
        assert await asyncio.wait_for(proc.wait(), timeout=60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
