"""The NAS's page reader in C: a run of page files read into their memory and checksummed
in one call, without the GIL.

Read in Python, each page costs an open, a claim, a ``readv``, a checksum, a release and a
close, 41 µs of Python per page under the profiler, all of it holding the GIL; the two
read threads of a 2-core machine then mostly wait for each other. Landing a 4k-token
history (258 pages, 95 MB) from the page cache took 15-26 ms on two threads that way, and
13-15 ms through this reader (2-core AMD EPYC, four alternating runs, medians of 15),
whose floor is the kernel's copy out of the page cache (13 ms on one thread). In a
worker's restore turn, where the ledger's answer is parsed on the event loop's thread
while the NAS is read, the landing's median of 11 went from 20-24 ms to 19-20.

The checksum is computed with the xxhash functions of the Python package the blocks were
written with (its extension exports them), so both sides hash alike. The reader is built
for this machine on first use (:mod:`.build`); where it cannot be, :func:`page_reader`
returns None (logged once) and the NAS reads in Python
(:func:`tiering.tiers.nas_files.read_pages`), with the same answers.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import subprocess
from collections.abc import Sequence
from pathlib import Path

import xxhash._xxhash

from tiering.native.build import Library, built, cache_dir

log = logging.getLogger(__name__)

READER = Library(
    stem="read-pages",
    sources=(Path(__file__).with_name("read_pages.c"),),
    flags=("-O2", "-shared", "-fPIC", "-std=c11"),
)
_XXH = (
    "XXH3_createState",
    "XXH3_freeState",
    "XXH3_64bits_reset",
    "XXH3_64bits_update",
    "XXH3_64bits_digest",
)
_P, _I = ctypes.c_void_p, ctypes.c_int64


class PageReader:
    """:func:`tiering.tiers.nas_files.read_pages` through the compiled reader."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = lib.kvgate_read_pages
        self._fn.restype = _I
        self._fn.argtypes = [_I, _P, _P, _P, _P, _I, _P, _P, _P]
        lib.kvgate_max_parts.restype = _I
        #: most parts (header included) one page may be read into
        self.max_parts: int = lib.kvgate_max_parts()
        hashing = ctypes.CDLL(xxhash._xxhash.__file__)  # already loaded: its own symbols
        self._xxh = (_P * len(_XXH))(*(ctypes.cast(getattr(hashing, s), _P) for s in _XXH))

    def __call__(
        self, paths: Sequence[str], pages: Sequence[Sequence[memoryview]], covered: int
    ) -> list[tuple[int, int]]:
        """Per page, ``(bytes read or -errno, checksum)``: see ``read_pages``."""
        n = len(paths)
        if len(pages) != n:
            raise ValueError(f"{n} paths for {len(pages)} pages")
        parts = [v for page in pages for v in page]
        if any(len(page) > self.max_parts for page in pages):
            raise ValueError(f"a page is read into at most {self.max_parts} parts")
        # from_buffer refuses read-only memory: the reader writes every part
        ptrs = (_P * len(parts))(*(ctypes.addressof(ctypes.c_char.from_buffer(v)) for v in parts))
        lens = (_I * len(parts))(*(v.nbytes for v in parts))
        counts = (_I * n)(*(len(page) for page in pages))
        names = (ctypes.c_char_p * n)(*(p.encode() for p in paths))
        got, digests = (_I * n)(), (ctypes.c_uint64 * n)()
        failed = self._fn(n, names, counts, ptrs, lens, covered, self._xxh, got, digests)
        if failed:
            raise ValueError(f"the page reader refused its arguments (errno {-failed})")
        return list(zip(got, digests, strict=True))


@functools.cache
def page_reader() -> PageReader | None:
    """The reader built for this machine (built now if need be), or None where it cannot be
    built or loaded; the reason is logged once."""
    try:
        return PageReader(ctypes.CDLL(str(built(READER, cache_dir()))))
    except (OSError, AttributeError, subprocess.SubprocessError, RuntimeError) as exc:
        log.warning("native: no compiled page reader (%s); the NAS reads in Python", exc)
        return None
