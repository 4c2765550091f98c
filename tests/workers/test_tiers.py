"""The worker as `kvgate worker` composes it: evicted KV comes back from a lower tier, and the
usage says which tier served the prompt."""

from __future__ import annotations

from pathlib import Path

import httpx

from kvgate.settings import load_settings
from kvgate.wiring.engine import load_model, running_engine, worker_options
from tests.support.worker import tiny_pool_bytes
from workers.context import ServerConfig
from workers.engine.tiered_offload import TieredOffload
from workers.server import create_app

PAGE = 16


async def test_evicted_prefix_is_served_from_the_host_tier(
    smollm2_gguf: Path, nas_dir: Path
) -> None:
    settings = load_settings(
        home=smollm2_gguf.parent.parent, nas_path=nas_dir, database_url=None, s3_endpoint=None
    )
    # 40 pages of tiny-random KV: one 200-token prompt takes 13.
    options = worker_options(
        settings,
        model="tiny-random",
        device="cpu",
        kv_pool_bytes=tiny_pool_bytes(40, PAGE),
        page_size=PAGE,
    )
    loaded = load_model(options)
    with running_engine(loaded, options, settings) as engine:
        assert isinstance(engine.offload, TieredOffload)
        # pages are keyed by the weights, not by the served name
        assert engine.offload.model_fingerprint == loaded.fingerprint == "tiny-random@cpu"
        # and by how they are computed: float32 on CPU here (KV in float16 all the same)
        assert engine.offload.compute == "float32@cpu"
        config = ServerConfig(tier_stats=engine.offload.stats)
        app = create_app(engine, loaded.tokenizer, loaded.chat_template, config)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://w") as c:

            async def complete(prompt: list[int]) -> dict:
                body = {"model": "tiny-random", "prompt": prompt, "max_tokens": 4, "temperature": 0}
                resp = await c.post("/v1/completions", json=body)
                assert resp.status_code == 200, resp.text
                return resp.json()

            first = await complete(list(range(3000, 3200)))
            for i in range(4):  # other conversations push the first one out of the pool
                await complete(list(range(5000 + 200 * i, 5200 + 200 * i)))
            again = await complete(list(range(3000, 3200)))
            metrics = (await c.get("/metrics")).text
    tiers = again["usage"]["prompt_tokens_details"]["cached_tokens_by_tier"]
    assert tiers["host"] > 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == sum(tiers.values())
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    host_hits = next(
        line
        for line in metrics.splitlines()
        if line.startswith('kvgate_worker_tier_hits_total{tier="host"}')
    )
    assert float(host_hits.split()[-1]) * PAGE >= tiers["host"]
    assert "kvgate_worker_tier_write_queue_pages" in metrics
    evicted = next(x for x in metrics.splitlines() if x.startswith("kvgate_worker_evicted_pages"))
    assert float(evicted.split()[-1]) * PAGE >= tiers["host"]  # what came back had been evicted
