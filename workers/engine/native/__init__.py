"""A float32 kernel for a few rows through a weight, compiled for this CPU on first use.

Batch-1 decode multiplies one row by every weight, so it runs at the speed its matmul
reads the weights. On a 2-core AMD EPYC, one row through SmolLM2's 121 projections (540
MB) read 19-20 GB/s with oneDNN's packed kernel, 11.6 with ``F.linear`` (MKL) and 18 with
``torch.mv``, where a plain sum over the same bytes read 33: the libraries' small-row
paths do not stream at the machine's bandwidth, MKL's least on AMD. :mod:`rowdot.c` does
one thing, ``y = x @ w.T`` for a few rows of ``x``, as one sequential read of ``w`` per
core: the same pass took 17.6-21.3 ms through it against 23.1-29.6 ms packed (25-31 GB/s,
four runs), and on the 113 MB LM head alone it read as fast as ``Tensor.sum`` (29-32 GB/s).

The C file is compiled with the system's C compiler (``$CC``, else ``cc``) and
``-O3 -march=native -fopenmp`` into ``$XDG_CACHE_HOME/kvgate/native`` (``~/.cache`` by
default), named by the digest of the source, the flags, the compiler's version and the
CPU's model and flags, so that a cached library is only ever loaded on the machine kind it
was built for. A build is written to a temporary file and renamed, so workers starting
together never load half a file. Where there is no compiler, or the build fails,
:func:`load` returns None (logged once) and the projections keep the libraries' kernels.

The library links ``libgomp.so.1``; in a process that has loaded torch, that is torch's
own copy (the same soname), so the kernel runs on the calling thread's OpenMP team with
torch's thread count, not on a second team competing for the cores.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("rowdot.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11")
#: seconds a build may take (it takes well under one)
BUILD_TIMEOUT_S = 60.0


class RowDot:
    """``x @ weight.T`` for float32 CPU tensors through the compiled kernel."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = lib.kvgate_rowdot
        self._fn.restype = None
        self._fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3
        isa = lib.kvgate_rowdot_isa
        isa.restype = ctypes.c_char_p
        #: the instruction set the build used: ``avx512``, ``avx2`` or ``scalar``
        self.isa: str = isa().decode()

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``x`` ``[m, k]`` times ``weight`` ``[n, k]`` transposed: ``[m, n]``."""
        if x.dtype != torch.float32 or weight.dtype != torch.float32:
            raise TypeError(f"rowdot takes float32, not {x.dtype} and {weight.dtype}")
        if x.device.type != "cpu" or weight.device.type != "cpu":
            raise ValueError("rowdot runs on the CPU")
        m, k = x.shape
        n, wk = weight.shape
        if wk != k:
            raise ValueError(f"x has {k} columns, the weight {wk}")
        if not weight.is_contiguous():
            raise ValueError("the weight must be contiguous (row-major)")
        x = x.contiguous()
        y = torch.empty((m, n), dtype=torch.float32)
        self._fn(weight.data_ptr(), x.data_ptr(), y.data_ptr(), m, n, k)
        return y


def cache_dir() -> Path:
    """Where builds are kept: ``$XDG_CACHE_HOME/kvgate/native``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvgate" / "native"


@functools.cache
def load() -> RowDot | None:
    """The kernel built for this machine (built now if need be), or None where it cannot
    be built or loaded; the reason is logged once."""
    try:
        return RowDot(ctypes.CDLL(str(_built(cache_dir()))))
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        log.warning("rowdot: no native kernel (%s); one row keeps the libraries' kernels", exc)
        return None


def _compiler() -> str:
    cc = os.environ.get("CC") or "cc"
    found = shutil.which(cc)
    if found is None:
        raise RuntimeError(f"no C compiler ({cc!r} is not on PATH)")
    return found


def _cpu_identity() -> str:
    """The CPU model and feature flags (what ``-march=native`` compiles for)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(wanted)))


def _built(directory: Path) -> Path:
    """The library for this source, compiler and CPU under ``directory``, built if missing."""
    cc = _compiler()
    version = subprocess.run(
        [cc, "--version"], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
    ).stdout
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(), version.encode()):
        digest.update(part)
    digest.update(_cpu_identity().encode())
    target = directory / f"rowdot-{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".rowdot-", suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run(
            [cc, *FLAGS, str(SOURCE), "-o", tmp],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        if done.returncode:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
