"""The NAS tier's read buffers: dropped slabs are reused, slabs still viewed never are."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import torch

from tests.support.tiering import chain, namespace
from tiering.tiers.nas import NasConfig, NasTier
from tiering.tiers.slabs import SlabPool

MIB = 1 << 20


def _address(view: memoryview) -> int:
    return np.frombuffer(view, dtype=np.uint8).ctypes.data


def test_a_dropped_slab_is_reused_and_accounted() -> None:
    pool = SlabPool(max_idle_bytes=16 * MIB)
    buf = pool.take(3 * MIB)
    assert buf.nbytes == 3 * MIB and not buf.readonly
    first = _address(buf)
    del buf
    assert pool.idle_bytes == 4 * MIB  # whole 2 MiB pages
    again = pool.take(3 * MIB + 5)
    assert _address(again) == first and again.nbytes == 3 * MIB + 5
    assert pool.idle_bytes == 0
    other = pool.take(5 * MIB)  # another size class: fresh memory
    assert _address(other) != first


def test_a_slab_viewed_anywhere_is_not_handed_out() -> None:
    pool = SlabPool(max_idle_bytes=16 * MIB)
    buf = pool.take(2 * MIB)
    buf[:4] = b"kept"
    page = buf[:MIB].toreadonly()  # as a block's payload views its slab
    tensor = torch.frombuffer(buf[MIB:], dtype=torch.uint8)  # as a restore hands the pool
    del buf
    gc.collect()
    assert pool.idle_bytes == 0
    fresh = pool.take(2 * MIB)
    fresh[:4] = b"new!"
    assert bytes(page[:4]) == b"kept"
    del page
    assert pool.idle_bytes == 0  # the tensor still views the slab
    del tensor
    assert pool.idle_bytes == 2 * MIB


def test_idle_memory_is_capped_and_released_on_close() -> None:
    pool = SlabPool(max_idle_bytes=2 * MIB)
    a, b = pool.take(MIB), pool.take(MIB)
    del a, b
    assert pool.idle_bytes == 2 * MIB  # the second one was unmapped
    pool.close()
    assert pool.idle_bytes == 0
    c = pool.take(MIB)
    del c
    assert pool.idle_bytes == 0  # a closed pool keeps nothing


async def test_nas_reads_reuse_memory_without_touching_blocks_still_held(nas_dir: Path) -> None:
    nas = NasTier(NasConfig(nas_dir, fsync=False, threads=2))
    first, second = chain(namespace("a"), 6), chain(namespace("b"), 6)
    await nas.put_many(first + second)
    held = await nas.get_many([b.key for b in first])
    assert nas._slabs.idle_bytes == 0
    dropped = await nas.get_many([b.key for b in second])
    del dropped
    # the loop still holds the read's results until this task next waits
    assert await nas.longest_prefix([b.key for b in second]) == 6
    idle = nas._slabs.idle_bytes
    assert idle > 0
    again = await nas.get_many([b.key for b in second])  # into the memory just dropped
    assert nas._slabs.idle_bytes < idle
    assert [bytes(g.payload) for g in again] == [bytes(b.payload) for b in second]
    assert [bytes(g.payload) for g in held] == [bytes(b.payload) for b in first]
    nas.close()
