"""What the engine's kernels are built from; the building itself (compiled for this CPU on
first use, cached by digest) is :mod:`tiering.native.build`'s.
"""

from __future__ import annotations

from pathlib import Path

from tiering.native.build import Library, cache_dir
from tiering.native.build import built as _built

__all__ = ["KERNELS", "built", "cache_dir"]

#: ``-ffp-contract=off``: a product is rounded before it is added, as torch rounds it (the
#: rotation's halves are then torch's to the bit)
KERNELS = Library(
    stem="kernels",
    sources=tuple(
        Path(__file__).with_name(name)
        for name in ("rowdot.c", "norm.c", "glue.c", "attention.c", "decode_step.c")
    ),
    headers=tuple(Path(__file__).with_name(name) for name in ("exp.h", "team.h")),
    flags=(
        *("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11"),
        "-ffp-contract=off",
    ),
    libs=("-lm",),
)


def built(directory: Path) -> Path:
    """The kernels' library for this compiler and CPU under ``directory``, built if missing."""
    return _built(KERNELS, directory)
