"""Where one page lives in SGLang's host pool, and copying it to and from our bytes.

SGLang's zero-copy interface hands the backend host indices; the host pool's
``get_page_buffer_meta`` turns them into raw (pointer, size) buffers — K and V per page for
page-first MHA, K and V per layer for layer-first MHA, one buffer per page or layer for
MLA. We store a page as the bytes of SGLang's *flat data page* (``get_data_page(...,
flat=True)``), which holds every K before every V, so the buffers are put in that order
and both of SGLang's interfaces read and write the same bytes.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

#: One page: its buffers in host memory, as (address, bytes), in flat-data-page order.
PageBuffers = list[tuple[int, int]]


def page_buffers(
    host_pool: Any, host_indices: Any, n_pages: int, *, is_mla: bool, page_bytes: int
) -> list[PageBuffers]:
    """The buffers of each of the ``n_pages`` pages at ``host_indices``."""
    ptrs, sizes = host_pool.get_page_buffer_meta(host_indices)
    per_page = len(ptrs) // n_pages
    pages = []
    for i in range(n_pages):
        span = slice(i * per_page, (i + 1) * per_page)
        chunk = list(zip(ptrs[span], sizes[span], strict=True))
        if not is_mla:
            # MHA lists K, V per layer; the flat page holds every K before every V.
            chunk = chunk[0::2] + chunk[1::2]
        if sum(size for _, size in chunk) != page_bytes:
            raise ValueError(
                f"host pool buffers of a page add up to {sum(s for _, s in chunk)} bytes, "
                f"not the {page_bytes} of one page: unsupported host-pool layout"
            )
        pages.append(chunk)
    return pages


def gather(buffers: PageBuffers, page_bytes: int) -> bytearray:
    """A copy of one page's bytes, read straight out of host memory."""
    page = bytearray(page_bytes)
    base, offset = ctypes.addressof(ctypes.c_char.from_buffer(page)), 0
    for ptr, size in buffers:
        ctypes.memmove(base + offset, ptr, size)
        offset += size
    return page


def scatter(payload: memoryview, buffers: PageBuffers) -> None:
    """Copy one page's bytes straight into host memory."""
    src = np.frombuffer(payload, dtype=np.uint8)
    base, offset = src.ctypes.data, 0
    for ptr, size in buffers:
        ctypes.memmove(ptr, base + offset, size)
        offset += size
