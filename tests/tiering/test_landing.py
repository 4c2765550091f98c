"""Pages read straight into their final memory: the fence, the NAS's in-place reads, and
the object store's pages copied in as each GET arrives."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from kvgate.stack.seaweed import S3Endpoint
from tests.support.tiering import (
    ThrottlingProxy,
    chain,
    flip_byte,
    namespace,
    object_config,
    serving,
)
from tiering import native
from tiering.codec import Block
from tiering.landing import Landed, Landing
from tiering.tiers.nas import NasConfig, NasTier
from tiering.tiers.object import ObjectTier


def _views(pages: int, nbytes: int, split: int) -> list[list[memoryview]]:
    """``pages`` pages of ``nbytes`` each, each in two separate buffers cut at ``split``."""
    return [
        [memoryview(bytearray(split)), memoryview(bytearray(nbytes - split))] for _ in range(pages)
    ]


def _bytes(parts: list[memoryview]) -> bytes:
    return b"".join(bytes(p) for p in parts)


def test_a_page_lands_once_and_nothing_lands_after_close() -> None:
    ns = namespace()
    blocks = chain(ns, 4)
    size = blocks[0].nbytes
    short = Landing(ns.digest, "float16", blocks[0].shape, [[memoryview(bytearray(size - 1))]])
    with pytest.raises(ValueError, match="lands in"):
        short.claim(0)  # a caller's bug, found before anything is written
    views = _views(4, size, 200)
    landing = Landing(ns.digest, "float16", blocks[0].shape, views)

    assert landing.fill(0, blocks[0]) is Landed.LANDED
    assert _bytes(views[0]) == bytes(blocks[0].payload)
    assert landing.fill(0, blocks[1]) is Landed.REFUSED  # written once: a second writer is refused
    assert _bytes(views[0]) == bytes(blocks[0].payload)
    other = chain(namespace("another tenant"), 1)[0]
    assert landing.fill(1, other) is Landed.MISSING  # not a page of this landing's namespace
    assert landing.claim(1) is not None  # ... so the page is still free to claim
    assert landing.fill(1, blocks[1]) is Landed.REFUSED  # refused while being written
    landing.release(1, landed=False)  # that write failed verification: the page is free again
    assert landing.fill(1, blocks[1]) is Landed.LANDED
    assert _bytes(views[1]) == bytes(blocks[1].payload)

    writing = landing.claim(2)
    assert writing is not None
    held, given_back = [], []

    def hold(i: int):  # type: ignore[no-untyped-def]
        held.append(i)
        return lambda: given_back.append(i)

    assert landing.close(0.0, hold) == {2} and landing.closed
    assert held == [2] and given_back == []
    assert landing.claim(3) is None and landing.fill(3, blocks[3]) is Landed.REFUSED
    landing.release(2)  # the late write ends: its memory may be used again
    assert given_back == [2]


@pytest.mark.parametrize("reader", ["native", "python"])
async def test_nas_reads_pages_in_place_across_threads_with_misses_and_damage(
    nas_dir: Path, reader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same answers whether the compiled page reader or the Python one reads."""
    if reader == "python":
        monkeypatch.setattr(native, "page_reader", lambda: None)
    elif native.page_reader() is None:
        pytest.skip("no C compiler here")
    nas = NasTier(NasConfig(nas_dir, fsync=False, threads=3))
    ns = namespace()
    blocks = chain(ns, 10)
    await nas.put_many(blocks[:3] + blocks[4:])  # page 3 is missing
    damaged = nas.path(blocks[5].key)
    flip_byte(damaged)
    truncated = nas.path(blocks[7].key)
    truncated.write_bytes(truncated.read_bytes()[:-1])
    emptied = nas.path(blocks[6].key)  # what a power cut can leave of an unsynced block
    emptied.write_bytes(b"")
    misplaced = nas.path(blocks[8].key)  # a whole, valid block, but of another key
    misplaced.write_bytes(nas.path(blocks[9].key).read_bytes())

    views = _views(12, blocks[0].nbytes, 100)
    landing = Landing(ns.digest, "float16", blocks[0].shape, views)
    at = [i + 2 for i in range(len(blocks))]  # pages land two places further on
    got = await nas.land([b.key for b in blocks], landing, at)

    present = [0, 1, 2, 4, 9]
    assert [i for i, ok in enumerate(got) if ok] == present
    assert {got[i] for i in (3, 5, 6, 7, 8)} == {Landed.MISSING}  # absent or damaged
    assert all(_bytes(views[i + 2]) == bytes(blocks[i].payload) for i in present)
    assert _bytes(views[0]) == _bytes(views[1]) == bytes(blocks[0].nbytes)  # untouched
    assert not any(p.exists() for p in (damaged, truncated, emptied, misplaced))
    stats = nas.stats()
    assert (stats.hits, stats.misses, stats.corruptions) == (5, 5, 4)
    assert stats.bytes_read == 5 * blocks[0].nbytes

    # a page another tier holds is refused, and says nothing about this tier's copy
    assert landing.fill(0, blocks[0]) is Landed.LANDED
    assert await nas.land([blocks[1].key, blocks[0].key], landing, [1, 0]) == [
        Landed.LANDED,
        Landed.REFUSED,
    ]
    assert nas.path(blocks[0].key).exists() and nas.stats().misses == 5

    landing.close()
    again = await nas.land([blocks[0].key], landing, [0])
    assert again == [Landed.REFUSED] and _bytes(views[0]) == bytes(blocks[0].payload)  # closed
    assert nas.path(blocks[0].key).exists()  # refused, not damaged
    nas.close()


class _CountingLanding(Landing):
    """A landing that says when ``expect`` pages have landed."""

    def __init__(self, *args, expect: int, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kw)
        self.landed, self.expect, self.enough = 0, expect, asyncio.Event()

    def fill(self, i: int, block: Block) -> Landed:
        got = super().fill(i, block)
        self.landed += got is Landed.LANDED
        if self.landed >= self.expect:
            self.enough.set()
        return got


async def test_object_pages_land_as_their_gets_arrive_not_after_the_last(
    s3_server: S3Endpoint,
) -> None:
    ns = namespace()
    blocks = chain(ns, 5)
    cfg = object_config(s3_server)
    async with ObjectTier(cfg) as direct:
        await direct.put_many(blocks[:4])  # page 4 is missing
        slow = direct.object_name(blocks[3].key)
    proxy = ThrottlingProxy(s3_server.url, refuse=0)
    proxy.held.add(slow.rsplit("/", 1)[-1])  # page 3's GET waits until released
    views = _views(5, blocks[0].nbytes, 100)
    landing = _CountingLanding(ns.digest, "float16", blocks[0].shape, views, expect=3)
    async with serving(proxy) as url, ObjectTier(replace(cfg, endpoint_url=url)) as tier:
        reading = asyncio.create_task(tier.land([b.key for b in blocks], landing, range(5)))
        # pages 0-2 are in place while page 3's GET is still held
        await asyncio.wait_for(landing.enough.wait(), 60)
        assert not reading.done()
        assert all(_bytes(views[i]) == bytes(blocks[i].payload) for i in range(3))
        assert _bytes(views[3]) == bytes(blocks[3].nbytes)  # not yet
        proxy.release.set()
        got = await reading
        assert got == [Landed.LANDED] * 4 + [Landed.MISSING]
        assert _bytes(views[3]) == bytes(blocks[3].payload)
        stats = tier.stats()
        assert (stats.hits, stats.misses, stats.bytes_read) == (4, 1, 4 * blocks[0].nbytes)
