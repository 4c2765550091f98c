"""Our forward pass matches transformers' LlamaForCausalLM on the same weights.

Tolerance: max absolute logit difference 1e-4 in float32 (observed ~1e-6), for a whole
prompt prefilled at once, prefilled in chunks against the paged cache, and decoded token by
token; greedy continuations must be identical for 32 steps.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.engine import TinyModel, greedy, run, tiny_engine, tiny_llama, tokens
from workers.engine.batch import SeqChunk, build_batch
from workers.engine.engine import EngineOptions
from workers.engine.kv_pool import KVPool
from workers.engine.model import LlamaModel

TOLERANCE = 1e-4


def _reference_logits(model: TinyModel, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model.reference(torch.tensor([ids])).logits[0]


def _ours_in_chunks(
    model: TinyModel, ids: list[int], cuts: list[int], kv_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Logits of every position, computing the sequence in chunks ending at ``cuts``."""
    ours = LlamaModel(model.config, model.state_dict, kv_dtype=kv_dtype)
    itemsize = kv_dtype.itemsize
    pool = KVPool(
        model.config, pool_bytes=model.config.kv_bytes_per_token(itemsize) * 16 * 32, dtype=kv_dtype
    )
    pages = pool.alloc(-(-len(ids) // 16))
    rows = []
    start = 0
    for end in [*cuts, len(ids)]:
        batch, _ = build_batch(
            [SeqChunk(ids[start:end], start, pages)],
            page_size=16,
            page_stride=pool.page_stride,
            device=torch.device("cpu"),
            dtype=kv_dtype,
        )
        rows.append(ours.forward(batch, pool)[0])
        start = end
    return torch.stack(rows)


def test_chunked_prefill_and_decode_match_transformers() -> None:
    model = tiny_llama(seed=1)
    ids = torch.randint(3, 512, (70,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = _reference_logits(model, ids)
    # a 21-token chunk (crosses a page), a 30-token chunk against the cached prefix, then
    # single-token decode steps for the rest
    cuts = [21, 51, *range(52, 70)]
    ours = _ours_in_chunks(model, ids, cuts)
    expected = ref[[c - 1 for c in [*cuts, 70]]]
    assert (ours - expected).abs().max().item() < TOLERANCE


def test_llama3_rope_scaling_matches_transformers() -> None:
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    model = tiny_llama(seed=2, rope_scaling=scaling)
    ids = torch.randint(3, 512, (200,), generator=torch.Generator().manual_seed(2)).tolist()
    ours = _ours_in_chunks(model, ids, [150])
    ref = _reference_logits(model, ids)
    assert (ours - ref[[149, 199]]).abs().max().item() < TOLERANCE


async def test_greedy_32_steps_match_transformers_generate() -> None:
    model = tiny_llama(seed=3)
    engine = tiny_engine(model, kv_dtype="float32")  # transformers keeps its KV in float32
    try:
        for n, seed in [(5, 0), (37, 1)]:
            ids = torch.randint(
                3, 512, (n,), generator=torch.Generator().manual_seed(seed)
            ).tolist()
            ours = tokens(await run(engine, f"g{n}", ids, greedy(32)))
            ref = model.reference.generate(
                torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32, do_sample=False
            )[0, n:].tolist()
            assert ours == ref
            assert len(set(ours)) > 4  # the random model really varies its output
    finally:
        engine.close()


async def test_half_precision_paths_run_and_track_float32() -> None:
    """The CUDA dtypes (bf16/fp16), exercised on CPU: masks, RoPE tables and KV follow them."""
    model = tiny_llama(seed=3)
    ids = torch.randint(3, 512, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    firsts = []
    for dtype in ("float32", "bfloat16", "float16"):
        # KV in the model's dtype, as on CUDA; chunked, so that masks are used
        engine = tiny_engine(model, dtype=dtype, kv_dtype=dtype, token_budget=16)
        try:
            assert engine.pool.layout.dtype == dtype
            out = tokens(await run(engine, dtype, ids, greedy(16)))
        finally:
            engine.close()
        assert len(out) == 16
        firsts.append(out[:4])
    assert firsts[1] == firsts[0] and firsts[2] == firsts[0]


def test_attention_gathers_into_one_reused_buffer() -> None:
    """Each layer's KV gather reuses the model's buffer: a fresh tensor per call would be a
    fresh mmap (and a page fault per 4 KiB) for the large ones."""
    model = tiny_llama(seed=2)
    ids = torch.randint(3, 512, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    ours = LlamaModel(model.config, model.state_dict)
    pool = KVPool(model.config, pool_bytes=model.config.kv_bytes_per_token(4) * 16 * 8)
    pages = pool.alloc(3)
    device = torch.device("cpu")
    ours.forward(
        build_batch(
            [SeqChunk(ids[:39], 0, pages)],
            page_size=16,
            page_stride=pool.page_stride,
            device=device,
        )[0],
        pool,
    )
    buffer = ours._gathered.data_ptr()
    logits = ours.forward(
        build_batch(
            [SeqChunk(ids[39:], 39, pages)],
            page_size=16,
            page_stride=pool.page_stride,
            device=device,
        )[0],
        pool,
    )
    assert ours._gathered.data_ptr() == buffer, "a smaller gather allocated again"
    expected = _reference_logits(model, ids)[-1]
    assert (logits[0] - expected).abs().max().item() < TOLERANCE


def test_kv_dtype_is_float16_on_cpu_by_default_and_halves_a_tokens_bytes() -> None:
    config = tiny_llama(seed=3).config
    default = EngineOptions(device="cpu", dtype="float32")
    assert default.resolved_kv_dtype() == torch.float16
    assert EngineOptions(device="cpu", kv_dtype="float32").resolved_kv_dtype() == torch.float32
    assert EngineOptions(device="cuda", dtype="bfloat16").resolved_kv_dtype() == torch.bfloat16
    assert 2 * default.kv_bytes_per_token(config) == config.kv_bytes_per_token(4)
    assert default.describe() == "float32 on cpu, KV in float16"
    with pytest.raises(ValueError, match="kv_dtype 'int8' is not one of"):
        EngineOptions(device="cpu", kv_dtype="int8").resolved_kv_dtype()  # type: ignore[arg-type]


async def test_float16_kv_tracks_float32_kv() -> None:
    """float16 K and V under float32 compute: logits within 2e-2 of float32 KV, through
    chunked prefill (masks in the KV dtype) and decode, and the same greedy tokens."""
    model = tiny_llama(seed=3)
    ids = torch.randint(3, 512, (70,), generator=torch.Generator().manual_seed(4)).tolist()
    cuts = [21, 51, *range(52, 70)]
    wide = _ours_in_chunks(model, ids, cuts)
    narrow = _ours_in_chunks(model, ids, cuts, kv_dtype=torch.float16)
    assert 0 < (narrow - wide).abs().max().item() < 2e-2  # rounded, but only just
    outputs = []
    for kv_dtype in ("float32", "float16"):
        engine = tiny_engine(model, kv_dtype=kv_dtype, token_budget=16)
        try:
            assert engine.pool.layout.dtype == kv_dtype
            outputs.append(tokens(await run(engine, kv_dtype, ids, greedy(16))))
        finally:
            engine.close()
    assert outputs[0] == outputs[1]
