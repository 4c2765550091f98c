"""The yardsticks `kvgate bench engine` compares the built-in engine against.

Two of them: this machine's fp32 matmul throughput (the roofline a prefill can approach)
and Hugging Face ``transformers`` running the very same weights and prompts, prefill and
decode through its own KV cache. ``transformers`` is a dev dependency, imported here only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from workers.engine.config import ModelConfig

#: (m, k, n) matmul shapes whose best fp32 rate is taken as the roofline: a square one and
#: the MLP projection of a small model (hidden 576, intermediate 1536) at 128 to 2048 rows.
#: Short products matter on a shared machine: they can run to the end on all cores between
#: two interruptions by other processes, long ones rarely do, and underestimate the peak.
ROOFLINE_SHAPES: tuple[tuple[int, int, int], ...] = (
    (1024, 1024, 1024),
    (2048, 576, 1536),
    (512, 576, 1536),
    (128, 576, 1536),
)


def matmul_gflops(
    shapes: tuple[tuple[int, int, int], ...] = ROOFLINE_SHAPES, reps: int = 20
) -> float:
    """This machine's fp32 matmul GFLOP/s now: the best rate over ``shapes`` and ``reps`` runs."""
    gen = torch.Generator().manual_seed(0)
    best = 0.0
    for m, k, n in shapes:
        a = torch.randn(m, k, generator=gen)
        b = torch.randn(k, n, generator=gen)
        torch.mm(a, b)  # warm-up: thread pool start, allocator
        for _ in range(reps):
            start = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2 * m * k * n / (time.perf_counter() - start) / 1e9)
    return best


def prefill_flops(config: ModelConfig, tokens: int) -> float:
    """FLOPs of a causal forward pass over ``tokens`` new tokens (logits for the last only).

    Counts the projections and MLP (2 FLOPs per weight per token), causal attention
    (QK^T and AV over half the square) and one row of the LM head.
    """
    h, d = config.hidden_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    per_layer_weights = h * q + 2 * h * kv + q * h + 3 * h * config.intermediate_size
    dense = 2 * tokens * per_layer_weights * config.num_hidden_layers
    attention = 2 * tokens * tokens * q * config.num_hidden_layers  # 2 matmuls x causal half
    head = 2 * h * config.vocab_size
    return float(dense + attention + head)


class HFBaseline:
    """``transformers.LlamaForCausalLM`` with our weights, timed the way we time our engine."""

    def __init__(self, config: ModelConfig, state: dict[str, torch.Tensor]) -> None:
        try:
            from transformers import LlamaConfig, LlamaForCausalLM
        except ImportError as exc:
            raise RuntimeError(
                "the comparison needs transformers (pip install 'kvgate[dev]'), or pass --no-hf"
            ) from exc

        self.model = LlamaForCausalLM(LlamaConfig(**config.to_hf_dict())).eval()
        self.model.load_state_dict(state, strict=not config.tie_word_embeddings)
        if config.tie_word_embeddings:
            self.model.tie_weights()

    @torch.inference_mode()
    def prefill_tokens_per_s(self, prompt: Sequence[int]) -> float:
        """Tokens/s of one forward pass over ``prompt`` (filling a fresh KV cache)."""
        ids = torch.tensor([list(prompt)])
        start = time.perf_counter()
        self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
        return len(prompt) / (time.perf_counter() - start)

    @torch.inference_mode()
    def decode_tokens_per_s(self, prompts: Sequence[Sequence[int]], steps: int) -> float:
        """Generated tokens/s of greedy decoding ``steps`` tokens for a batch of equal-length prompts."""
        ids = torch.tensor([list(p) for p in prompts])
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
        past, next_ids = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
        start = time.perf_counter()
        for _ in range(steps):
            out = self.model(input_ids=next_ids, cache=past, use_cache=True)
            past, next_ids = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
        return len(prompts) * steps / (time.perf_counter() - start)
