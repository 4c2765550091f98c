"""The model's weight matmuls, ``x @ weight.T``, and the CPU kernels they run on.

On a CPU in float32 each weight is packed once for oneDNN. MKL's sgemm (behind
``F.linear``) ran at about half of oneDNN's speed at the row counts of batched decode, and
worst on AMD CPUs; the packed weight avoids both. One row is different: a decode step of a
single sequence streams every weight once for a single row, and there oneDNN's packed
kernel is not the fastest. On the 2-core Xeon, one row through SmolLM2's 121 projections
(540 MB) took 23.0 ms packed and 17.6 ms with MKL over the weight stored transposed
(``x @ weight.T.contiguous()``, a GEMV); at 8 rows the same MKL call took 40 ms against
oneDNN's 29. So a projection on such a CPU keeps both copies and picks by row count.

How fast each library is differs by CPU, so whether the transposed copy is worth its memory
(a second copy of the weights: 540 MB for SmolLM2 in float32) is measured when the model
loads (:func:`choose_single_row_kernel`): the copies stay only where they beat the packed
kernel by :data:`SINGLE_ROW_MARGIN`. A machine without the memory for them
(:func:`room_for_transposed`) never makes them. Elsewhere (CUDA, other dtypes, torch without
oneDNN) a projection is plain ``F.linear``.
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

log = logging.getLogger(__name__)

#: Entries oneDNN (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) and torch's ideep layer over it
#: (``LRU_CACHE_CAPACITY``) keep for the packed matmuls, unless the environment sets them.
#: Each entry is one row count of one weight's shape and holds ~1-2 MB of buffers for it,
#: and each cache keeps 1,024 by default: a worker serving prompts of every length grew by
#: 2.2 GB (SmolLM2's shapes, 600 row counts), and the 30-minute soak's worker kept growing
#: after warm-up. A step uses about five entries (four per layer's shapes, one for the LM
#: head), so 64 keep a steady decode batch's every entry.
ONEDNN_CACHE_ENTRIES = 64

#: The transposed copies are kept when one row through them takes at most this share of
#: the packed kernel's time: a second copy of the weights is worth a clear win, not noise.
SINGLE_ROW_MARGIN = 0.9

#: Passes of one row through every projection, per kernel, of which the fastest counts.
SINGLE_ROW_PASSES = 3

#: The transposed copies are made only where the memory available at load is at least this
#: many times their bytes: while the model loads, the weights as read, their packed copies
#: and the candidates all live at once, and the KV pool still has to fit after.
ROOM_FACTOR = 3


def room_for_transposed(weight_bytes: int) -> bool:
    """Whether this machine has the memory to try transposed copies of ``weight_bytes``:
    a second copy of a 1B-parameter model in float32 is 5 GB, which a small machine that
    fits the model itself may not have."""
    available, wanted = psutil.virtual_memory().available, ROOM_FACTOR * weight_bytes
    if available < wanted:
        log.warning(
            "one row: oneDNN packed weights, no transposed copies tried "
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
    from the transposed copy while :func:`choose_single_row_kernel` keeps one."""

    __slots__ = ("packed", "transposed", "weight")

    def __init__(self, weight: torch.Tensor, *, single_row_candidate: bool = True) -> None:
        """``single_row_candidate``: whether to keep a transposed copy for one row until
        :func:`choose_single_row_kernel` has timed it (False where memory is short)."""
        self.packed: torch.Tensor | None = None
        self.transposed: torch.Tensor | None = None
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
            if single_row_candidate:
                self.transposed = weight.t().contiguous()  # a candidate, until measured
            self.weight = None  # the packed copy serves every other row count

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.transposed is not None and x.shape[0] == 1:
            return x @ self.transposed
        if self.packed is not None:
            return self.by_packed(x)
        return F.linear(x, self.weight)  # type: ignore[arg-type]

    def by_packed(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T`` by oneDNN's packed kernel, whatever the row count."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")

    def by_transposed(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T`` by MKL over the transposed copy, whatever the row count."""
        return x @ self.transposed  # type: ignore[operator]


@dataclass(frozen=True)
class SingleRowChoice:
    """One row through every projection, timed with each kernel, and which one won."""

    packed_s: float
    transposed_s: float

    @property
    def transposed(self) -> bool:
        """Whether single rows go through the transposed copies."""
        return self.transposed_s <= SINGLE_ROW_MARGIN * self.packed_s

    def describe(self) -> str:
        """E.g. ``one row: MKL over transposed weights (17.6 ms a pass, oneDNN packed 23.0 ms)``."""
        ms = f"{self.transposed_s * 1e3:.1f} ms a pass, oneDNN packed {self.packed_s * 1e3:.1f} ms"
        if self.transposed:
            return f"one row: MKL over transposed weights ({ms})"
        return f"one row: oneDNN packed weights (transposed copies dropped: {ms})"


#: ``(projections, kernel, threads) -> seconds`` of the fastest pass of one row through
#: every projection with ``kernel`` ("packed" or "transposed")
PassTimer = Callable[[Sequence[Projection], str, int], float]


def fastest_pass(projections: Sequence[Projection], kernel: str, threads: int) -> float:
    """Seconds of the fastest of :data:`SINGLE_ROW_PASSES` passes of one row through every
    projection by ``kernel``, after one pass of warm-up (oneDNN sets up a primitive per shape).

    The passes run on a thread of their own with ``threads`` torch threads, as the engine's
    steps do; that thread's OpenMP team ends with it, leaving none beside the engine's.
    """
    widths = {p.transposed.shape[0] for p in projections}  # type: ignore[union-attr]
    rows = {n: torch.randn(1, n) for n in widths}
    calls = [
        (p.by_packed if kernel == "packed" else p.by_transposed, rows[p.transposed.shape[0]])  # type: ignore[union-attr]
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
    """Time one row through ``projections`` by each kernel and drop the transposed copies
    unless they win; None (and nothing timed) where no projection has both."""
    both = [p for p in projections if p.packed is not None and p.transposed is not None]
    if not both:
        return None
    choice = SingleRowChoice(
        packed_s=timer(both, "packed", threads), transposed_s=timer(both, "transposed", threads)
    )
    if not choice.transposed:
        for p in both:
            p.transposed = None
    return choice
