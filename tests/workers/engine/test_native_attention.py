"""Decode attention read from the paged pool in place: the same output as gathering each
row's context, widening it and running torch's SDPA over it, for every shape the model
gives it, and a clear refusal of what it cannot take."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from workers.engine import native

PAGE, LAYERS = 16, 4


def _attention() -> native.DecodeAttention:
    kernels = native.load()
    assert kernels is not None, "the native kernels did not build on this machine (see the log)"
    return kernels.decode_attention


def _pool(pages: int, kv_heads: int, d: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Layer 1's slot view of a pool laid out as the engine's (a page holds every layer)."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.randn(pages, LAYERS, PAGE, 2, kv_heads, d, generator=g).to(dtype)
    return pool.view(-1, 2, kv_heads, d)[PAGE:]


def _index(lengths: list[int], pages: int, seed: int) -> torch.Tensor:
    """Each row's slots: its own pages, in a shuffled order, padded with slot 0."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(pages - 1, generator=g)
    width = max(lengths)
    rows, used = [], 0
    for n in lengths:
        own = order[used : used + -(-n // PAGE)]
        used += len(own)
        slots = (own[:, None] * LAYERS * PAGE + torch.arange(PAGE)).view(-1)[:n]
        rows.append(torch.cat([slots, torch.zeros(width - n, dtype=torch.long)]))
    return torch.stack(rows)


def _torchs(
    q: torch.Tensor, slots: torch.Tensor, index: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """What the model computes without the kernel: gather, widen, SDPA with a padding mask."""
    B, L = index.shape
    _, _, K, D = slots.shape
    ctx = slots.index_select(0, index.view(-1)).float().view(B, L, 2, K, D)
    k, v = ctx[:, :, 0].transpose(1, 2), ctx[:, :, 1].transpose(1, 2)
    mask = torch.zeros(B, L).masked_fill_(torch.arange(L)[None] >= lengths[:, None], -torch.inf)
    qd = q.contiguous().view(B, K, -1, D)
    return F.scaled_dot_product_attention(qd, k, v, attn_mask=mask[:, None, None]).reshape(B, -1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(
    ("lengths", "kv_heads", "group", "d"),
    [
        ([1], 3, 3, 64),  # the first decode step of a one-token prompt
        ([255, 256, 257], 3, 3, 64),  # around the kernel's blocks of keys
        ([1000, 1, 517, 40], 3, 3, 64),  # padded rows, some far shorter than the longest
        ([700] * 9, 2, 4, 32),  # more rows than cores, another grouping and head width
        ([300, 90], 4, 1, 128),  # no grouping (one query head per KV head)
    ],
)
def test_it_is_torchs_gathered_sdpa_for_every_shape(
    lengths: list[int], kv_heads: int, group: int, d: int, dtype: torch.dtype
) -> None:
    pages = sum(-(-n // PAGE) for n in lengths) + 3
    slots = _pool(pages, kv_heads, d, dtype, seed=len(lengths) * 7 + d)
    index = _index(lengths, pages, seed=d)
    lens = torch.tensor(lengths)
    wide = torch.randn(len(lengths), 2 * kv_heads * group * d, generator=torch.Generator().manual_seed(1))  # fmt: skip
    q = wide[:, : kv_heads * group * d] * 3  # strided rows, as the model's qkv gives them
    got = _attention()(q, slots, index, lens)
    assert got.shape == q.shape
    torch.testing.assert_close(got, _torchs(q, slots, index, lens), atol=2e-6, rtol=1e-5)


def test_sharp_scores_weigh_as_a_softmax_does() -> None:
    """Scores tens apart (a query aligned with one key): the weights are e^-40 and less,
    the output that key's value, as the float softmax gives it."""
    slots = _pool(4, 1, 8, torch.float32, seed=3)
    index = _index([40], 4, seed=3)
    key = slots[index[0, 17], 0, 0]
    q = (key / key.norm() * 40 * 8**0.5)[None]
    got = _attention()(q, slots, index, torch.tensor([40]))
    torch.testing.assert_close(got, _torchs(q, slots, index, torch.tensor([40])))


def test_what_it_cannot_take_is_refused_with_what_to_fix() -> None:
    attention = _attention()
    slots = _pool(4, 3, 64, torch.float16, seed=0)
    index, lens, q = _index([20], 4, seed=0), torch.tensor([20]), torch.randn(1, 576)
    with pytest.raises(TypeError, match="float32"):
        attention(q.double(), slots, index, lens)
    with pytest.raises(TypeError, match="float16 or float32"):
        attention(q, slots.bfloat16(), index, lens)
    with pytest.raises(ValueError, match="do not hold query heads"):
        attention(q[:, :100], slots, index, lens)
    with pytest.raises(TypeError, match="int64"):
        attention(q, slots, index.int(), lens)
    with pytest.raises(ValueError, match=r"index must be \[1, L\]"):
        attention(q, slots, index[0], lens)
    for bad in (0, 21):
        with pytest.raises(ValueError, match=r"lengths in 1 \.\. 20"):
            attention(q, slots, index, torch.tensor([bad]))
