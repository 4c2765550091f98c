"""The compiled page reader gives the Python reader's answers, page by page: whole blocks
with their checksum, short and missing files, a page read into several views, and a block
whose bytes were damaged (a checksum that no longer matches)."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest

from tiering import native
from tiering.codec import CorruptBlock, PageCheck, make_block
from tiering.tiers.nas_files import block_file, read_pages, write_block

NS = b"n" * 32
SHAPE = (2, 4, 2, 3, 8)


def _reader() -> native.PageReader:
    reader = native.page_reader()
    if reader is None:
        pytest.skip("no C compiler here")
    return reader


def _files(root: Path, n: int) -> tuple[list[str], list[bytes], list[np.ndarray]]:
    rng = np.random.default_rng(7)
    keys = [bytes(rng.integers(0, 256, 32, dtype=np.uint8)) for _ in range(n)]
    payloads = [rng.integers(0, 256, 768, dtype=np.uint8) for _ in range(n)]
    for key, payload in zip(keys, payloads, strict=True):
        write_block(root, make_block(key, NS, "float16", SHAPE, payload), fsync=False, chunk=1 << 20)  # fmt: skip
    return [block_file(root, k) for k in keys], keys, payloads


def _pages(check: PageCheck, n: int, splits: int) -> list[list[memoryview]]:
    """Per page a header and the payload as ``splits`` views, all fresh memory."""
    out = []
    for _ in range(n):
        payload = memoryview(bytearray(check.payload_bytes))
        step = check.payload_bytes // splits
        cuts = [payload[i * step : (i + 1) * step if i < splits - 1 else None] for i in range(splits)]  # fmt: skip
        out.append([memoryview(bytearray(check.header_bytes)), *cuts])
    return out


@pytest.mark.parametrize("splits", [1, 3])
def test_both_readers_land_the_same_bytes_and_answers(tmp_path: Path, splits: int) -> None:
    check = PageCheck(NS, "float16", SHAPE)
    paths, keys, payloads = _files(tmp_path, 5)
    with open(paths[1], "r+b") as f:  # a damaged byte in the payload
        f.seek(check.header_bytes + 100)
        f.write(b"\xff" if payloads[1][100] != 0xFF else b"\x00")
    with open(paths[2], "r+b") as f:  # a file cut short
        f.truncate(check.header_bytes + 10)
    paths[3] = paths[3] + ".gone"  # no such file
    answers = {}
    for name, read in (("python", read_pages), ("native", _reader())):
        pages = _pages(check, len(paths), splits)
        got = read(paths, pages, check.covered)
        answers[name] = got
        size = check.header_bytes + check.payload_bytes
        assert [g for g, _ in got] == [size, size, check.header_bytes + 10, -errno.ENOENT, size]
        for i in (0, 4):  # whole and intact: the payload, and a checksum that verifies
            check.verify(pages[i][0], keys[i], got[i][1])
            assert b"".join(pages[i][1:]) == payloads[i].tobytes()
        with pytest.raises(CorruptBlock, match="checksum mismatch"):
            check.verify(pages[1][0], keys[1], got[1][1])
        with pytest.raises(CorruptBlock):  # another key's header is refused too
            check.verify(pages[0][0], keys[4], got[0][1])
    assert answers["native"] == answers["python"]


def test_the_native_reader_refuses_memory_it_may_not_write(tmp_path: Path) -> None:
    check = PageCheck(NS, "float16", SHAPE)
    paths, _, _ = _files(tmp_path, 1)
    header = memoryview(bytearray(check.header_bytes))
    with pytest.raises(TypeError):
        _reader()(paths, [[header, memoryview(bytes(check.payload_bytes))]], check.covered)
