"""The model's weight matmuls, ``x @ weight.T``, and the CPU kernels they run on.

On a CPU in float32 each weight is packed once for oneDNN. MKL's sgemm (behind
``F.linear``) ran at about half of oneDNN's speed at the row counts of batched decode, and
worst on AMD CPUs; the packed weight avoids both. One row is different: a decode step of a
single sequence streams every weight once for a single row, so its speed is the speed the
weights are read at, and there oneDNN's packed kernel is not the fastest. The native
kernel (:mod:`workers.engine.native`) reads the row-major weight as one sequential stream
per core: on a 2-core AMD EPYC one row through SmolLM2's 121 projections (540 MB) took
20.3 ms through it against 27.5 packed (the same process, best of 5).

Which is faster differs by CPU, and the native kernel needs the row-major weight kept
beside the packed one (540 MB more for SmolLM2 in float32), so the choice is measured when
the model loads (:func:`choose_single_row_kernel`): the row-major weights stay only where
the native kernel beats the packed one by :data:`SINGLE_ROW_MARGIN`. A machine without
the memory for them (:func:`room_for_row_major`), or without a C compiler, keeps the
packed kernel alone. Elsewhere (CUDA, other dtypes, torch without oneDNN) a projection is
plain ``F.linear``.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil
import torch
import torch.nn.functional as F

from workers.engine.native import RowDot

log = logging.getLogger(__name__)

#: Entries oneDNN (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) and torch's ideep layer over it
#: (``LRU_CACHE_CAPACITY``) keep for the packed matmuls, unless the environment sets them.
#: Each entry is one row count of one weight's shape and holds ~1-2 MB of buffers for it,
#: and each cache keeps 1,024 by default: a worker serving prompts of every length grew by
#: 2.2 GB (SmolLM2's shapes, 600 row counts), and the 30-minute soak's worker kept growing
#: after warm-up. A step uses about five entries (four per layer's shapes, one for the LM
#: head), so 64 keep a steady decode batch's every entry.
ONEDNN_CACHE_ENTRIES = 64

#: The row-major weights are kept when one row through them takes at most this share of
#: the packed kernel's time: a second copy of the weights is worth a clear win, not noise.
SINGLE_ROW_MARGIN = 0.9

#: Passes of one row through every projection, per kernel, of which the fastest counts.
SINGLE_ROW_PASSES = 3

#: The row-major weights are kept as candidates only where the memory available at load is
#: at least this many times their bytes: while the model loads, the weights as read, their
#: packed copies and the candidates all live at once, and the KV pool still has to fit after.
ROOM_FACTOR = 3


def room_for_row_major(weight_bytes: int) -> bool:
    """Whether this machine has the memory to keep row-major weights of ``weight_bytes``
    beside the packed ones: a second copy of a 1B-parameter model in float32 is 5 GB,
    which a small machine that fits the model itself may not have."""
    available, wanted = psutil.virtual_memory().available, ROOM_FACTOR * weight_bytes
    if available < wanted:
        log.warning(
            "one row: oneDNN packed weights, the native kernel not tried "
            "(%.1f GB of memory available, %.1f GB wanted)",
            available / 1e9,
            wanted / 1e9,
        )
    return available >= wanted


@functools.cache
def _bound_onednn_caches() -> None:
    """Set the cache capacities, once, before the process' first packed matmul (both caches
    read their variables when first used)."""
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(ONEDNN_CACHE_ENTRIES))


class Projection:
    """``x @ weight.T``: on CPU in float32 from the oneDNN-packed weight, and a single row
    by the native kernel over the row-major weight while :func:`choose_single_row_kernel`
    keeps it."""

    __slots__ = ("packed", "row_major", "rowdot", "weight")

    def __init__(self, weight: torch.Tensor, *, rowdot: RowDot | None = None) -> None:
        """``rowdot``: the native kernel, whose row-major weight is kept for one row until
        :func:`choose_single_row_kernel` has timed it (None: no candidate)."""
        self.packed: torch.Tensor | None = None
        #: the weight as given, for the native kernel (a candidate until measured)
        self.row_major: torch.Tensor | None = None
        self.rowdot = rowdot
        self.weight: torch.Tensor | None = weight
        if (
            weight.device.type == "cpu"
            and weight.dtype == torch.float32
            and torch.backends.mkldnn.is_available()
        ):
            _bound_onednn_caches()
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(weight)
            except (AttributeError, RuntimeError):  # a torch build without the op: stay dense
                return
            if rowdot is not None:
                self.row_major = weight.contiguous()
            self.weight = None  # the packed copy serves every other row count

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.row_major is not None and x.shape[0] == 1:
            return self.rowdot(x, self.row_major)  # type: ignore[misc]
        if self.packed is not None:
            return self.by_packed(x)
        return F.linear(x, self.weight)  # type: ignore[arg-type]

    def by_packed(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T`` by oneDNN's packed kernel, whatever the row count."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")

    def by_native(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T`` by the native kernel over the row-major weight, whatever the row
        count."""
        return self.rowdot(x, self.row_major)  # type: ignore[misc,arg-type]

    def drop_row_major(self) -> None:
        """Single rows go through the packed weight from now on."""
        self.row_major = None


@dataclass(frozen=True)
class SingleRowChoice:
    """One row through every projection, timed with each kernel, and which one won."""

    packed_s: float
    native_s: float
    #: the native build's instruction set (``avx512``, ``avx2``, ``scalar``)
    isa: str

    @property
    def native(self) -> bool:
        """Whether single rows go through the native kernel."""
        return self.native_s <= SINGLE_ROW_MARGIN * self.packed_s

    def describe(self) -> str:
        """E.g. ``one row: native kernel (avx512) over row-major weights (20.3 ms a pass,
        oneDNN packed 27.5 ms)``."""
        ms = f"{self.native_s * 1e3:.1f} ms a pass, oneDNN packed {self.packed_s * 1e3:.1f} ms"
        if self.native:
            return f"one row: native kernel ({self.isa}) over row-major weights ({ms})"
        return f"one row: oneDNN packed weights (native kernel ({self.isa}) dropped: {ms})"


#: ``(projections, kernel, threads) -> seconds`` of the fastest pass of one row through
#: every projection with ``kernel`` ("packed" or "native")
PassTimer = Callable[[Sequence[Projection], str, int], float]


def fastest_pass(projections: Sequence[Projection], kernel: str, threads: int) -> float:
    """Seconds of the fastest of :data:`SINGLE_ROW_PASSES` passes of one row through every
    projection by ``kernel``, after one pass of warm-up (oneDNN sets up a primitive per shape).

    The passes run on a thread of their own with ``threads`` torch threads, as the engine's
    steps do; that thread's OpenMP team ends with it, leaving none beside the engine's.
    """
    widths = {p.row_major.shape[1] for p in projections}  # type: ignore[union-attr]
    rows = {n: torch.randn(1, n) for n in widths}
    calls = [
        (p.by_packed if kernel == "packed" else p.by_native, rows[p.row_major.shape[1]])  # type: ignore[union-attr]
        for p in projections
    ]
    seconds: list[float] = []
    failed: list[BaseException] = []

    def run() -> None:
        torch.set_num_threads(threads)
        try:
            with torch.inference_mode():
                for i in range(SINGLE_ROW_PASSES + 1):
                    start = time.perf_counter()
                    for call, x in calls:
                        call(x)
                    if i:
                        seconds.append(time.perf_counter() - start)
        except BaseException as exc:  # raised again on the caller's thread, below
            failed.append(exc)

    thread = threading.Thread(target=run, name="projection-timing")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return min(seconds)


def choose_single_row_kernel(
    projections: Sequence[Projection], threads: int, timer: PassTimer = fastest_pass
) -> SingleRowChoice | None:
    """Time one row through ``projections`` by each kernel and drop the row-major weights
    unless the native kernel wins; None (and nothing timed) where no projection has both."""
    both = [p for p in projections if p.packed is not None and p.row_major is not None]
    if not both:
        return None
    choice = SingleRowChoice(
        packed_s=timer(both, "packed", threads),
        native_s=timer(both, "native", threads),
        isa=both[0].rowdot.isa,  # type: ignore[union-attr]
    )
    if not choice.native:
        for p in both:
            p.drop_row_major()
    return choice
