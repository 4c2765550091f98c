"""The NAS's file writes: a block's parts reach the file in order, whatever the chunk bound
and however short the kernel's writes come back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tiering.tiers import nas_files
from tiering.tiers.nas_files import write_all, write_block_file

PARTS = [b"head", b"", b"payload-bytes", b"!"]


@pytest.mark.parametrize("chunk", [1, 3, 5, 8 << 20])
def test_the_parts_are_written_in_order_each_call_within_the_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    calls: list[int] = []
    writev = os.writev

    def short_writev(fd: int, buffers: list[memoryview]) -> int:
        size = sum(b.nbytes for b in buffers)
        calls.append(size)
        # the kernel may write less than asked: here at most 4 bytes a call
        return writev(fd, [b"".join(bytes(b) for b in buffers)[:4]])

    monkeypatch.setattr(nas_files.os, "writev", short_writev)
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        write_all(fd, [memoryview(p) for p in PARTS], chunk)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(PARTS)
    assert max(calls) <= chunk


def test_a_page_is_one_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    writev = os.writev

    def counted(fd: int, buffers: list[memoryview]) -> int:
        calls.append(len(buffers))
        return writev(fd, buffers)

    monkeypatch.setattr(nas_files.os, "writev", counted)
    header, payload = memoryview(b"h" * 64), memoryview(bytes(range(256)) * 1440)
    path = str(tmp_path / "ab" / "page.kvb")
    write_block_file(path, [header, payload], fsync=False, chunk=8 << 20)
    assert calls == [2]
    assert Path(path).read_bytes() == bytes(header) + bytes(payload)
