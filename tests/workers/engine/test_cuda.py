"""The built-in engine on a CUDA GPU: the same answers as transformers, and KV that comes back
from the tiers exactly as it left.

CI machines have no GPU, so these tests are skipped there; `scripts/gpu-check.sh` runs them
on one (with the CUDA benchmarks). What they pin down is what only a GPU exercises: kernels
other than the CPU's, KV pages copied device -> host on eviction and host -> device on
restore, bf16 pages through the block codec, and seeded sampling with logits on the device.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
import torch

from tests.support.engine import TinyModel, greedy, run, tiny_llama, tokens
from tiering.cost import CostConfig, CostModel
from tiering.keys import compute_tag
from tiering.store import TieredStore
from tiering.tiers.host import HostTier
from tiering.tiers.nas import NasConfig, NasTier
from workers.engine.api import SamplingParams
from workers.engine.batch import SeqChunk, build_batch
from workers.engine.engine import EngineOptions, TorchEngine
from workers.engine.kv_pool import KVLayout, KVPool
from workers.engine.model import LlamaModel
from workers.engine.pinned import host_copy_in
from workers.engine.tiered_offload import TieredOffload

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu-check.sh runs it on one)"
)

CUDA = torch.device("cuda")
PAGE = 16
#: fp32 on the GPU with TF32 off: a different summation order than transformers' kernels,
#: nothing more (observed differences are around 1e-6)
TOLERANCE = 1e-3


@pytest.fixture(autouse=True)
def exact_fp32() -> object:
    """TF32 would round fp32 matmuls to 10 mantissa bits: off, so fp32 means fp32."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _engine(model: TinyModel, dtype: str, pages: int, offload=None) -> TorchEngine:  # type: ignore[no-untyped-def]
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    page_bytes = model.config.kv_bytes_per_token(itemsize) * PAGE
    opts = EngineOptions(device="cuda", dtype=dtype, kv_pool_bytes=pages * page_bytes)  # type: ignore[arg-type]
    return TorchEngine(model.config, model.state_dict, opts, offload=offload)


def _hf_greedy(model: TinyModel, ids: list[int], n: int) -> list[int]:
    """transformers' greedy continuation on the GPU, recomputing the whole sequence each step."""
    reference = model.reference.to(CUDA)
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = reference(torch.tensor([seq], device=CUDA)).logits[0, -1]
            seq.append(int(logits.argmax()))
    return seq[len(ids) :]


def test_fp32_logits_and_greedy_tokens_match_transformers_on_cuda() -> None:
    model = tiny_llama(seed=1)
    ids = _ids(70, 1)
    with torch.no_grad():
        ref = model.reference.to(CUDA)(torch.tensor([ids], device=CUDA)).logits[0]
    ours = LlamaModel(model.config, model.state_dict, device=CUDA)
    pool = KVPool(model.config, pool_bytes=model.config.kv_bytes_per_token(4) * PAGE * 8, device=CUDA)  # fmt: skip
    pages = pool.alloc(-(-len(ids) // PAGE))
    rows, start = [], 0
    cuts = [21, 51, *range(52, 70)]  # a chunk across a page, a chunk over the cache, decodes
    for end in [*cuts, len(ids)]:
        batch, _ = build_batch(
            [SeqChunk(ids[start:end], start, pages)],
            page_size=PAGE,
            page_stride=pool.page_stride,
            device=CUDA,
        )
        rows.append(ours.forward(batch, pool)[0])
        start = end
    expected = ref[[c - 1 for c in [*cuts, len(ids)]]]
    assert (torch.stack(rows) - expected).abs().max().item() < TOLERANCE

    engine = _engine(model, "float32", pages=64)
    try:
        got = tokens(asyncio.run(run(engine, "greedy", ids, greedy(32))))
    finally:
        engine.close()
    assert got == _hf_greedy(model, ids, 32)


def test_seeded_sampling_on_cuda_is_reproducible() -> None:
    model = tiny_llama(seed=2)
    engine = _engine(model, "bfloat16", pages=64)
    sampling = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.9, top_k=50, seed=7, ignore_eos=True)  # fmt: skip
    try:
        first = tokens(asyncio.run(run(engine, "a", _ids(40, 3), sampling)))
        engine.flush_cache()
        second = tokens(asyncio.run(run(engine, "b", _ids(40, 3), sampling)))
    finally:
        engine.close()
    assert first == second and len(first) == 24


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kv_restored_from_host_and_nas_gives_the_same_tokens_on_cuda(
    dtype: str, tmp_path: Path
) -> None:
    """Pages evicted from GPU memory come back from host RAM and from the NAS bit for bit.

    In fp32 the restored run must equal a cold recompute. In bf16 a prompt prefilled in one
    piece and one prefilled after a cached prefix round differently (different kernels), so
    there the reference is the same prompt served from a resident prefix: identical KV must
    give identical tokens.
    """
    model = tiny_llama(seed=3)
    prompt, other = _ids(70, 1), _ids(100, 2)
    layout = KVLayout(dtype, PAGE, model.config.num_hidden_layers, model.config.num_key_value_heads, model.config.head_dim)  # fmt: skip

    async def build() -> TieredStore:
        nas = NasTier(NasConfig(tmp_path / "nas", fsync=False))
        res = contextlib.AsyncExitStack()
        res.callback(nas.close)
        cost = CostModel(CostConfig(prior_prefill_tokens_per_s=50.0))  # restoring always pays
        return TieredStore(HostTier(1 << 28, copy_in=host_copy_in()), nas=nas, cost=cost, resources=res)  # fmt: skip

    cold = _engine(model, dtype, pages=64)
    try:
        expected = tokens(asyncio.run(run(cold, "cold", prompt, greedy(8))))
        if dtype == "bfloat16":
            expected = tokens(asyncio.run(run(cold, "resident", prompt, greedy(8))))
    finally:
        cold.close()

    offload = TieredOffload(
        build,
        model_fingerprint="cuda-test",
        layout=layout,
        compute=compute_tag(dtype, "cuda"),
        fetch_timeout_s=30,
    )
    engine = _engine(model, dtype, pages=-(-(len(other) + 4) // PAGE), offload=offload)
    full = len(prompt) // PAGE * PAGE
    try:
        asyncio.run(run(engine, "first", prompt, greedy(8)))
        for tier in ("host", "nas"):
            asyncio.run(run(engine, f"evict-{tier}", other, greedy(4)))  # fills the pool
            offload.drain()
            if tier == "nas":
                offload._call(_clear_host(offload), timeout=10)
            events = asyncio.run(run(engine, tier, prompt, greedy(8)))
            assert events[-1].cached_by_tier.get(tier) == full, events[-1].cached_by_tier
            assert tokens(events) == expected, (
                f"{dtype}: output differs after restoring from {tier}"
            )
    finally:
        engine.close()
        offload.close()


async def _clear_host(offload: TieredOffload) -> None:
    offload.store.host.clear()
