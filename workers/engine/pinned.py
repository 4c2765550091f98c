"""Torch adapter: copy host-tier blocks into page-locked memory when CUDA is present.

Pinned buffers let the engine's host→device copies run asynchronously at full PCIe speed.
This is the only place the host tier meets torch; pass :func:`host_copy_in` to
:class:`tiering.tiers.host.HostTier`.
"""

from __future__ import annotations

import torch

from tiering.tiers.host import CopyIn


def _pinned_copy(view: memoryview) -> memoryview:
    buf = torch.empty(view.nbytes, dtype=torch.uint8, pin_memory=True)
    buf.numpy()[:] = memoryview(view).cast("B")
    return memoryview(buf.numpy())


def host_copy_in() -> CopyIn | None:
    """The pinned-memory copy when CUDA is available, else None (use the default copy)."""
    return _pinned_copy if torch.cuda.is_available() else None
