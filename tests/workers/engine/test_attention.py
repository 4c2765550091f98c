"""A prefill chunk after a cached prefix attends the same whether cut in two or masked."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.support.engine import tiny_llama
from tests.workers.engine.test_model import TOLERANCE, _ours_in_chunks, _reference_logits
from workers.engine import attention
from workers.engine.attention import SPLIT_FROM, chunk_attention
from workers.engine.batch import SeqChunk, build_batch


def _chunk(n: int, prefix: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Queries ``[1, 4, n, 16]`` and keys, values ``[1, 2, prefix + n, 16]``, and the
    additive mask letting query ``i`` see keys ``0 .. prefix + i``."""
    gen = torch.Generator().manual_seed(n + prefix)
    q = torch.randn(1, 4, n, 16, generator=gen).to(dtype)
    k, v = (torch.randn(1, 2, prefix + n, 16, generator=gen).to(dtype) for _ in "kv")
    ctx = prefix + n
    allowed = torch.arange(ctx)[None, :] <= torch.arange(prefix, ctx)[:, None]
    mask = torch.zeros(allowed.shape, dtype=torch.float16).masked_fill_(~allowed, float("-inf"))
    return q, k, v, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_long_chunk_cut_in_two_matches_one_masked_call(dtype: torch.dtype) -> None:
    n, prefix = 512, 1536
    assert n * (n + prefix) >= SPLIT_FROM  # the chunk takes the cut
    q, k, v, mask = _chunk(n, prefix, dtype)
    cut = chunk_attention(q, k, v, mask)
    masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(dtype), enable_gqa=True)
    assert cut.dtype == dtype and cut.shape == masked.shape
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert (cut.float() - masked.float()).abs().max().item() < tolerance


def test_chunks_cut_in_two_match_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every chunk after the first takes the cut (threshold lowered): the logits of each
    chunk's last token stay within the float32 tolerance of transformers'."""
    monkeypatch.setattr(attention, "SPLIT_FROM", 0)
    model = tiny_llama(seed=5)
    ids = torch.randint(3, 512, (90,), generator=torch.Generator().manual_seed(5)).tolist()
    cuts = [33, 60, 61]  # a 27-token chunk, a single token, a 29-token one
    ref = _reference_logits(model, ids)[[c - 1 for c in [*cuts, 90]]]
    assert (_ours_in_chunks(model, ids, cuts) - ref).abs().max().item() < TOLERANCE


def test_a_chunk_cut_in_two_gets_no_mask_built() -> None:
    """The batch builds a chunk's mask only where attention reads it: a chunk after a prefix
    that attention cuts in two (the second half of a 4k-token prompt) carries none, a small
    one carries its mask, and attention refuses a small one without it."""
    cpu = torch.device("cpu")
    pages = list(range(256))
    big, _ = build_batch(
        [SeqChunk([5] * 2048, 2048, pages)], page_size=16, page_stride=16, device=cpu
    )
    assert big.prefill[0].mask is None
    small, _ = build_batch(
        [SeqChunk([5] * 30, 40, pages)], page_size=16, page_stride=16, device=cpu
    )
    mask = small.prefill[0].mask
    assert mask is not None and mask.shape == (30, 70)
    assert mask[0, 40].item() == 0.0 and mask[0, 41].item() == float("-inf")
    q, k, v, _ = _chunk(30, 40, torch.float32)
    with pytest.raises(ValueError, match="30 queries after 40 cached keys needs its mask"):
        chunk_attention(q, k, v, None)
