"""Log-probabilities as ``make up`` serves them on a CPU: the KV cache in float16 (the
default), checked against a recomputation by the same worker.

``test_logprobs`` compares float32 KV with ``transformers``; with float16 KV a float32
reference differs by the KV's rounding (about 5e-3 in log-probability on the tiny random
model). What a client can check is that the values describe the served model: asking the
worker again, one position at a time, for the next token after the prompt plus what it
generated (a prefill, not a decode step) gives the same probabilities within 1e-4.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from tests.support.worker import MODEL, tiny_engine
from workers.engine.engine import TorchEngine
from workers.engine.tokenizer import Tokenizer, load_tokenizer

PROMPT = "The capital of France is"
SAMPLED = {"temperature": 1.5, "top_p": 0.95, "seed": 7, "ignore_eos": True}


@pytest.fixture(scope="module")
def worker_engine() -> Iterator[TorchEngine]:
    """The worker's engine with its default KV dtype (float16 on the CPU)."""
    engine = tiny_engine(kv_pool_bytes=8 * 2**20)
    assert engine.options.resolved_kv_dtype() == torch.float16
    yield engine
    engine.close()


async def test_served_logprobs_match_the_worker_recomputing_each_position(
    worker_client: httpx.AsyncClient, smollm2_gguf: Path
) -> None:
    tokenizer: Tokenizer = load_tokenizer(smollm2_gguf)
    prompt = tokenizer.encode(PROMPT)
    params = {
        "max_new_tokens": 10,
        "temperature": SAMPLED["temperature"],
        "top_p": SAMPLED["top_p"],
        "sampling_seed": SAMPLED["seed"],
        "ignore_eos": True,
    }
    native = await worker_client.post(
        "/generate", json={"input_ids": prompt, "sampling_params": params}
    )
    assert native.status_code == 200, native.text
    ids = native.json()["output_ids"]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 10, "logprobs": 5, **SAMPLED}
    served = (await worker_client.post("/v1/completions", json=body)).json()["choices"][0]
    assert len(served["logprobs"]["top_logprobs"]) == len(ids)
    for pos, top in enumerate(served["logprobs"]["top_logprobs"]):
        again = await worker_client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": prompt + ids[:pos], "max_tokens": 1, "logprobs": 5},
        )
        assert again.status_code == 200, again.text
        recomputed = again.json()["choices"][0]["logprobs"]["top_logprobs"][0]
        shared = set(top) & set(recomputed)
        assert len(shared) >= 5
        for token in shared:
            assert math.exp(top[token]) == pytest.approx(math.exp(recomputed[token]), abs=1e-4)
