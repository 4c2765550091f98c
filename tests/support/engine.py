"""Shared helpers for the engine tests: a seeded tiny random Llama and a greedy driver."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from workers.engine.api import GenerateRequest, SamplingParams, TokenEvent
from workers.engine.config import ModelConfig
from workers.engine.engine import EngineOptions, TorchEngine
from workers.engine.offload import KVOffload


@dataclass(frozen=True)
class TinyModel:
    config: ModelConfig
    state_dict: dict[str, torch.Tensor]
    reference: LlamaForCausalLM


def tiny_llama(seed: int = 0, *, rope_scaling: dict | None = None) -> TinyModel:
    """A 2-layer GQA Llama with random weights, as transformers builds it from ``seed``."""
    torch.manual_seed(seed)
    rope = {"rope_type": "default", "rope_theta": 100000.0}
    if rope_scaling:
        rope = {**rope_scaling, "rope_theta": 100000.0}
    hf_config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_parameters=rope,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.2,  # large enough that greedy output varies token to token
    )
    reference = LlamaForCausalLM(hf_config).eval()
    # Our config read from transformers' own, as a checkpoint's config.json would be.
    config = ModelConfig.from_hf_dict(hf_config.to_dict())
    return TinyModel(config, reference.state_dict(), reference)


def tiny_engine(
    model: TinyModel, *, pages: int = 256, offload: KVOffload | None = None, **options: Any
) -> TorchEngine:
    """A CPU float32 engine on ``model`` whose pool holds ``pages`` pages (of its KV dtype);
    ``options`` replace EngineOptions fields, ``offload`` is its lower tier (none)."""
    opts = replace(EngineOptions(device="cpu", dtype="float32"), **options)
    pool_bytes = pages * opts.page_size * opts.kv_bytes_per_token(model.config)
    return TorchEngine(
        model.config, model.state_dict, replace(opts, kv_pool_bytes=pool_bytes), offload=offload
    )


def greedy(max_tokens: int, **extra: object) -> SamplingParams:
    """Greedy sampling that never stops early on EOS (random models emit it by chance)."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **extra)


async def run(
    engine: TorchEngine, rid: str, ids: list[int], sampling: SamplingParams, salt: str = ""
) -> list[TokenEvent]:
    """Every event of one request, in order."""
    request = GenerateRequest(rid=rid, input_ids=tuple(ids), sampling=sampling, cache_salt=salt)
    return [event async for event in engine.generate(request)]


def tokens(events: list[TokenEvent]) -> list[int]:
    """All generated token ids of a request's events."""
    return [t for e in events for t in e.token_ids]


async def run_together(
    engine: TorchEngine, *requests: tuple[str, list[int], SamplingParams]
) -> list[list[TokenEvent]]:
    """Every event of each ``(rid, ids, sampling)`` request, all queued before the engine's
    next step, so that they share steps (else a short request could end before the next
    one is queued). The engine's step lock is held until every request is queued."""
    with engine._step_lock:
        tasks = [asyncio.ensure_future(run(engine, *r)) for r in requests]
        rids = {rid for rid, _, _ in requests}
        deadline = time.monotonic() + 30
        while not rids <= engine._streams.keys():
            if any(t.done() for t in tasks) or time.monotonic() > deadline:
                break  # refused (its error is raised below) or never queued
            await asyncio.sleep(0.01)
    return list(await asyncio.gather(*tasks))
