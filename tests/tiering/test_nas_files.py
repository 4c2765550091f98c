"""The NAS's file reads and writes: a block's parts reach the file in order, whatever the
chunk bound and however short the kernel's writes come back, and come back into their views
in order however short its reads come back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tiering.tiers import nas_files
from tiering.tiers.nas_files import read_into, write_all, write_block_file

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


@pytest.mark.parametrize("cap", [1, 3, 7, 1 << 20])
def test_reads_fill_the_views_in_order_however_short_each_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap: int
) -> None:
    data = bytes(range(40))
    path = tmp_path / "f"
    path.write_bytes(data)
    readv = os.readv

    def short_readv(fd: int, buffers: list[memoryview]) -> int:
        # NFS or a signal: at most ``cap`` bytes a call, into the first views asked for
        trimmed, room = [], cap
        for b in buffers:
            if room <= 0:
                break
            trimmed.append(b[:room])
            room -= trimmed[-1].nbytes
        return readv(fd, trimmed)

    monkeypatch.setattr(nas_files.os, "readv", short_readv)
    views = [memoryview(bytearray(n)) for n in (5, 1, 12, 4)]  # 22 of the file's 40 bytes
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_into(fd, views, 22) == 22
    finally:
        os.close(fd)
    assert b"".join(bytes(v) for v in views) == data[:22]


def test_a_file_shorter_than_its_views_reads_what_it_has(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abcdefg")
    views = [memoryview(bytearray(4)), memoryview(bytearray(6))]
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_into(fd, views, 10) == 7
    finally:
        os.close(fd)
    assert bytes(views[0]) == b"abcd" and bytes(views[1][:3]) == b"efg"
