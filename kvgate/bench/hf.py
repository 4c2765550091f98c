"""The yardsticks `kvgate bench engine` compares the built-in engine against.

Three of them: this machine's matmul throughput in the engine's device and dtype (the
roofline a prefill can approach), its memory bandwidth (the floor under a decode step,
which reads every weight once), and Hugging Face ``transformers`` running the very same
weights and prompts on the same device, prefill and decode through its own KV cache.
``transformers`` is a dev dependency, imported here only.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence

import torch

from workers.engine.config import ModelConfig

CPU = torch.device("cpu")


def roofline_shapes(config: ModelConfig) -> tuple[tuple[int, int, int], ...]:
    """(m, k, n) matmul shapes whose best rate is taken as the roofline: a square one and the
    model's own MLP projection (hidden x intermediate) at 128 to 2048 rows.

    Short products matter on a shared machine: they can run to the end on all cores between
    two interruptions by other processes, long ones rarely do, and underestimate the peak.
    """
    h, ff = config.hidden_size, config.intermediate_size
    return ((1024, 1024, 1024), (2048, h, ff), (512, h, ff), (128, h, ff))


def _sync(device: torch.device) -> None:
    """Wait for queued kernels, so that a timer read after it covers their work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_gflops(
    shapes: tuple[tuple[int, int, int], ...],
    *,
    device: torch.device = CPU,
    dtype: torch.dtype = torch.float32,
    reps: int = 20,
) -> float:
    """Matmul GFLOP/s on ``device`` in ``dtype`` now: the best rate over ``shapes`` and ``reps``."""
    gen = torch.Generator(device=device).manual_seed(0)
    best = 0.0
    for m, k, n in shapes:
        a = torch.randn(m, k, generator=gen, device=device, dtype=dtype)
        b = torch.randn(k, n, generator=gen, device=device, dtype=dtype)
        torch.mm(a, b)  # warm-up: thread pool start, allocator, kernel choice
        _sync(device)
        for _ in range(reps):
            start = time.perf_counter()
            torch.mm(a, b)
            _sync(device)
            best = max(best, 2 * m * k * n / (time.perf_counter() - start) / 1e9)
    return best


def copy_bandwidth(*, device: torch.device = CPU, size: int = 2**30, reps: int = 3) -> float:
    """GB/s of copying a ``size``-byte buffer on ``device`` now, best of ``reps``.

    Counted as STREAM counts its copy: the bytes read plus the bytes written. The default
    1 GiB is far larger than any CPU cache, so every byte comes from and goes to memory.
    """
    src = torch.ones(size // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: fault in both buffers' pages
    best = 0.0
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = max(best, 2 * size / (time.perf_counter() - start) / 1e9)
    return best


def read_bandwidth(*, device: torch.device = CPU, size: int = 2**30, reps: int = 3) -> float:
    """GB/s of summing a ``size``-byte buffer on ``device`` now, best of ``reps``: the rate
    of a pass that only reads, as a decode step reads its weights (each byte counted once).

    Beside :func:`copy_bandwidth` it tells how much of the copy's rate reading alone gets:
    on the 2-core AMD EPYC VMs, two threads summing read 29-32 GB/s where a copy with
    streaming stores moved 46-50 (read plus written) and a copy through the cache 33.
    """
    src = torch.ones(size // 4, dtype=torch.float32, device=device)
    src.sum()  # warm-up: fault the pages in
    best = 0.0
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        src.sum()
        _sync(device)
        best = max(best, size / (time.perf_counter() - start) / 1e9)
    return best


def decode_bytes(config: ModelConfig, dtype_bytes: int, kv_bytes: int, context: int) -> int:
    """Bytes one decode step of one sequence reads from memory at best: every weight once
    (the embedding only as the LM head, a row of it being all a step looks up) and the
    K and V of ``context`` tokens (``kv_bytes`` each)."""
    h, d, ff = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * ff + 2 * h  # projections, MLP, norms
    weights = per_layer * config.num_hidden_layers + h + config.vocab_size * h
    return weights * dtype_bytes + context * kv_bytes


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

    def __init__(
        self,
        config: ModelConfig,
        state: dict[str, torch.Tensor],
        *,
        device: torch.device = CPU,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        try:
            from transformers import LlamaConfig, LlamaForCausalLM
        except ImportError as exc:
            raise RuntimeError(
                "the comparison needs transformers (pip install 'kvgate[dev]'), or pass --no-hf"
            ) from exc

        self.device = device
        # Built on the device in its dtype: an 8B-sized model in fp32 on the CPU would not fit.
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                self.model = LlamaForCausalLM(LlamaConfig(**config.to_hf_dict())).eval()
        finally:
            torch.set_default_dtype(previous)
        self.model.load_state_dict(state, strict=not config.tie_word_embeddings)
        if config.tie_word_embeddings:
            self.model.tie_weights()
        # transformers 5.2x renamed the KV cache argument and output field from
        # ``past_key_values`` to ``cache``; the GPU machines run an older release than CI.
        params = inspect.signature(self.model.forward).parameters
        self._cache_name = "cache" if "cache" in params else "past_key_values"

    @torch.inference_mode()
    def prefill_tokens_per_s(self, prompt: Sequence[int]) -> float:
        """Tokens/s of one forward pass over ``prompt`` (filling a fresh KV cache)."""
        ids = torch.tensor([list(prompt)], device=self.device)
        _sync(self.device)
        start = time.perf_counter()
        self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
        _sync(self.device)
        return len(prompt) / (time.perf_counter() - start)

    @torch.inference_mode()
    def decode_tokens_per_s(self, prompts: Sequence[Sequence[int]], steps: int) -> float:
        """Generated tokens/s of greedy decoding ``steps`` tokens for a batch of equal-length prompts."""
        ids = torch.tensor([list(p) for p in prompts], device=self.device)
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
        name = self._cache_name
        past, next_ids = getattr(out, name), out.logits[:, -1].argmax(-1, keepdim=True)
        _sync(self.device)
        start = time.perf_counter()
        for _ in range(steps):
            out = self.model(input_ids=next_ids, use_cache=True, **{name: past})
            past, next_ids = getattr(out, name), out.logits[:, -1].argmax(-1, keepdim=True)
        _sync(self.device)
        return len(prompts) * steps / (time.perf_counter() - start)
