"""Causal attention of a prefill chunk over its sequence's context, in few fused calls.

A chunk of ``n`` new tokens after ``prefix`` cached ones has query ``i`` see keys
``0 .. prefix + i``: a causal square aligned to the bottom right of the score matrix.
torch's fused attention skips masked blocks only for a causal square aligned to the top
left, so such a chunk either passes an additive mask (every block computed, then masked)
or is cut in two: the queries against the prefix, which they all see, and against their
own keys, causal from the chunk's start; the two halves' outputs are merged by their
log-sum-exp weights, which is exactly a softmax over all the keys (to float rounding).
On a CPU the cut costs two thirds of the masked call when chunk and prefix are both 2k
tokens (the second chunk of a 4k-token prompt), and a little more than it for small
chunks, where a call's fixed cost dominates; it needs the CPU flash kernel's log-sum-exp,
which only its ``aten`` op returns, so other devices keep the mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: Score-matrix size (queries x keys) from which a CPU chunk with a prefix is cut in two.
#: On a 2-core AMD EPYC in float32 (SmolLM2's 9 query and 3 KV heads): 2048 queries after
#: 2048 cached keys took 269 ms cut against 457 ms masked, 256 after 4096 took 52 against 70;
#: 256 after 256 (6.5 against 6.1 ms) and 64 after 2000 (7.0 against 6.4) were slower cut.
SPLIT_FROM = 2**20


def _flash_cpu() -> object | None:
    """The CPU flash kernel returning ``(output, logsumexp)``, if this torch has it."""
    try:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    except (AttributeError, RuntimeError):
        return None


_FLASH_CPU = _flash_cpu()


def cuts_in_two(n: int, ctx: int, device: torch.device) -> bool:
    """Whether :func:`chunk_attention` cuts a chunk of ``n`` queries over ``ctx`` keys in
    two; such a chunk needs no mask, so none is built for it (2048 queries after 2048
    cached keys would take a 32 MiB float32 mask, built and never read)."""
    return device.type == "cpu" and _FLASH_CPU is not None and n < ctx and n * ctx >= SPLIT_FROM


def chunk_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Attention of ``q`` ``[1, heads, n, D]`` over ``k``, ``v`` ``[1, kv_heads, ctx, D]``.

    The queries are the context's last ``n`` positions; ``mask`` (additive, ``[n, ctx]``)
    says what each sees, and may be None when the chunk is the whole context (then plain
    causal) or :func:`cuts_in_two` holds. Query heads share KV heads in groups
    (``enable_gqa``); ``q``, ``k`` and ``v`` share one dtype.
    """
    n, ctx = q.shape[2], k.shape[2]
    if n == ctx:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    if cuts_in_two(n, ctx, q.device):
        return _cut_in_two(q, k, v, ctx - n)
    if mask is None:
        raise ValueError(f"a chunk of {n} queries after {ctx - n} cached keys needs its mask")
    if q.device.type == "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), enable_gqa=True)
    # On CUDA the flash kernel takes no mask and the memory-efficient one, which does, takes
    # no grouped KV heads: a masked grouped call falls back to the math kernel, which writes
    # out the whole score matrix (an H200 prefilled 4,096 tokens of an 8B model at half
    # transformers' rate). Widened KV heads keep the fused kernel.
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype))


def _cut_in_two(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int) -> torch.Tensor:
    """:func:`chunk_attention` as a full call over the prefix and a causal one over the chunk."""
    flash = _FLASH_CPU
    assert flash is not None
    seen, seen_lse = flash(q, k[:, :, :prefix], v[:, :, :prefix], 0.0, False)  # type: ignore[operator]
    own, own_lse = flash(q, k[:, :, prefix:], v[:, :, prefix:], 0.0, True)  # type: ignore[operator]
    lse = torch.logaddexp(seen_lse, own_lse)  # float32, as the kernel accumulates
    out = seen.float().mul_(seen_lse.sub_(lse).exp_().unsqueeze(-1))
    return out.addcmul_(own.float(), own_lse.sub_(lse).exp_().unsqueeze(-1)).to(q.dtype)
