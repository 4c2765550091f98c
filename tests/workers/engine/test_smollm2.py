"""The forward pass on the real model: SmolLM2-135M-Instruct from its GGUF, through the model
registry's loader.

Same weights in transformers' LlamaForCausalLM and in our engine (float32, KV too): logits of a
prompt prefilled in two chunks agree within 1e-3 (observed ~1e-5; 30 layers and a
49k vocabulary accumulate more rounding than the tiny model), and greedy decoding gives
identical tokens for 32 steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.support.engine import run, tokens
from workers.engine.api import SamplingParams
from workers.engine.batch import SeqChunk, build_batch
from workers.engine.engine import EngineOptions, TorchEngine
from workers.engine.kv_pool import KVPool
from workers.engine.model import LlamaModel
from workers.engine.weights import load_model_weights

pytestmark = pytest.mark.slow

TOLERANCE = 1e-3
# "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n" in
# SmolLM2's vocabulary, so that greedy decoding produces real text rather than noise
PROMPT = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf: Path) -> tuple[object, dict[str, torch.Tensor], LlamaForCausalLM]:
    config, state = load_model_weights(smollm2_gguf)
    reference = LlamaForCausalLM(LlamaConfig(**config.to_hf_dict())).eval()
    reference.load_state_dict(state, strict=False)
    reference.tie_weights()
    return config, state, reference


def test_logits_match_transformers(smollm2) -> None:  # type: ignore[no-untyped-def]
    config, state, reference = smollm2
    ids = (
        PROMPT
        + torch.randint(300, 49152, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    )
    with torch.no_grad():
        ref = reference(torch.tensor([ids])).logits[0]
    model = LlamaModel(config, state)
    pool = KVPool(config, pool_bytes=config.kv_bytes_per_token(4) * 16 * 8)
    pages = pool.alloc(4)
    cpu = torch.device("cpu")
    first, _ = build_batch(
        [SeqChunk(ids[:30], 0, pages)], page_size=16, page_stride=pool.page_stride, device=cpu
    )
    rest, _ = build_batch(
        [SeqChunk(ids[30:], 30, pages)], page_size=16, page_stride=pool.page_stride, device=cpu
    )
    ours = torch.cat([model.forward(first, pool), model.forward(rest, pool)])
    assert (ours - ref[[29, len(ids) - 1]]).abs().max().item() < TOLERANCE


async def test_greedy_32_tokens_match_transformers(smollm2) -> None:  # type: ignore[no-untyped-def]
    config, state, reference = smollm2
    # min_tokens masks EOS for all 32 steps, as transformers' min_new_tokens does
    sampling = SamplingParams(max_tokens=32, temperature=0.0, min_tokens=32)
    ours = {}
    for kv_dtype in ("float32", "auto"):  # transformers' KV precision, then the default's
        options = EngineOptions(
            device="cpu", dtype="float32", kv_dtype=kv_dtype, kv_pool_bytes=64 << 20
        )
        engine = TorchEngine(config, state, options)
        try:
            ours[kv_dtype] = tokens(await run(engine, "smol", PROMPT, sampling))
        finally:
            engine.close()
    ref = reference.generate(
        torch.tensor([PROMPT]), max_new_tokens=32, min_new_tokens=32, do_sample=False
    )[0, len(PROMPT) :].tolist()
    assert ours["float32"] == ref
    assert ours["auto"] == ref  # float16 KV on the CPU changes no token here
