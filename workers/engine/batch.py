"""One forward step's input: the new tokens of several sequences and where their KV lives.

The scheduler says, per sequence, which tokens are new, at which position they start, the
sequence's page table and whether it wants logits. :func:`build_batch` turns that into the
few index tensors the model needs, built once per step and shared by every layer:
prefill chunks (several new tokens, attending to the cached prefix and causally to
themselves) come first, then single-token rows, which attend in one padded batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from workers.engine.attention import cuts_in_two


@dataclass(frozen=True)
class SeqChunk:
    """New tokens of one sequence for this step."""

    token_ids: Sequence[int]
    #: position of the first new token (= tokens already in the KV cache)
    start: int
    #: pool pages covering positions ``0 .. start + len(token_ids) - 1``
    pages: Sequence[int]
    want_logits: bool = True


@dataclass(frozen=True)
class PrefillRows:
    """A multi-token chunk: rows ``[row, row + n)`` of the batch."""

    row: int
    n: int
    #: pool slots of positions ``0 .. start + n - 1``
    ctx_slots: torch.Tensor
    #: ``[n, ctx]`` additive mask (0 or -inf); None when causal from position 0, or when
    #: attention cuts the chunk in two (:func:`~workers.engine.attention.cuts_in_two`)
    mask: torch.Tensor | None


@dataclass(frozen=True)
class ForwardBatch:
    """Index tensors for one forward step (all on the model's device)."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    write_slots: torch.Tensor  # [T] pool slot receiving each token's K and V
    prefill: list[PrefillRows]
    decode_row: int  # rows [decode_row, T) are single-token sequences
    decode_slots: torch.Tensor | None  # [B, ctx_max] pool slots, padded
    #: ``[B, 1, 1, ctx_max]`` additive mask hiding the padding; None when there is none
    decode_mask: torch.Tensor | None
    #: ``[B]`` context length of each single-token row (its slots past that are padding)
    decode_lengths: torch.Tensor | None
    logit_rows: torch.Tensor  # rows whose logits are wanted, in chunk order

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def _slots(pages: Sequence[int], n: int, page_stride: int, offsets: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(pages, dtype=torch.long)
    return (table[:, None] * page_stride + offsets).view(-1)[:n]


def build_batch(
    chunks: Sequence[SeqChunk],
    *,
    page_size: int,
    page_stride: int,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> tuple[ForwardBatch, list[int]]:
    """Lay out ``chunks`` for the model; also returns the chunk order used (prefill first).

    Token ``o`` of page ``p`` is slot ``p * page_stride + o`` of a layer's slot view
    (:attr:`~workers.engine.kv_pool.KVPool.page_stride`: a page holds every layer).

    Masks are additive, in ``dtype``, the dtype attention runs in (the KV's): attention
    would otherwise convert a boolean mask in every layer.
    """

    def additive(allowed: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))
        return mask.to(device)

    order = sorted(range(len(chunks)), key=lambda i: len(chunks[i].token_ids) == 1)
    offsets = torch.arange(page_size)
    ids: list[int] = []
    positions: list[int] = []
    writes: list[torch.Tensor] = []
    prefill: list[PrefillRows] = []
    logit_rows: list[int] = []
    decode: list[int] = []
    for i in order:
        c = chunks[i]
        n = len(c.token_ids)
        row = len(ids)
        ids.extend(c.token_ids)
        end = c.start + n
        if c.want_logits:
            logit_rows.append(row + n - 1)
        if n == 1:
            decode.append(i)
            positions.append(c.start)
            continue
        ctx = _slots(c.pages, end, page_stride, offsets)
        positions.extend(range(c.start, end))
        writes.append(ctx[c.start :])
        mask = None
        if c.start and not cuts_in_two(n, end, device):  # query i sees keys 0 .. start + i
            mask = additive(torch.arange(end)[None, :] <= torch.arange(c.start, end)[:, None])
        prefill.append(PrefillRows(row, n, ctx.to(device), mask))
    decode_row = len(ids) - len(decode)
    decode_slots = decode_mask = decode_lengths = None
    if decode:
        ctx_max = max(chunks[i].start + 1 for i in decode)
        width = -(-ctx_max // page_size)
        rows = [list(chunks[i].pages[:width]) for i in decode]
        table = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long)
        lengths = [chunks[i].start + 1 for i in decode]
        lens = torch.tensor(lengths, dtype=torch.long)
        slots = (table[:, :, None] * page_stride + offsets).view(len(decode), -1)[:, :ctx_max]
        writes.append(slots[torch.arange(len(decode)), lens - 1])
        if min(lengths) < ctx_max:
            decode_mask = additive(torch.arange(ctx_max)[None, :] < lens[:, None])[:, None, None]
        decode_slots = slots.contiguous().to(device)
        decode_lengths = lens.to(device)
    batch = ForwardBatch(
        input_ids=torch.tensor(ids, dtype=torch.long).to(device),
        positions=torch.tensor(positions, dtype=torch.long).to(device),
        write_slots=torch.cat(writes).to(device),
        prefill=prefill,
        decode_row=decode_row,
        decode_slots=decode_slots,
        decode_mask=decode_mask,
        decode_lengths=decode_lengths,
        logit_rows=torch.tensor(logit_rows, dtype=torch.long).to(device),
    )
    return batch, order
