"""float32 kernels for the CPU decode step, compiled for this CPU on first use.

Batch-1 decode multiplies one row by every weight, so it runs at the speed its matmul
reads the weights. On a 2-core AMD EPYC, one row through SmolLM2's 121 projections (540
MB) read 19-20 GB/s with oneDNN's packed kernel, 11.6 with ``F.linear`` (MKL) and 18 with
``torch.mv``, where a plain sum over the same bytes read 33: the libraries' small-row
paths do not stream at the machine's bandwidth, MKL's least on AMD. :mod:`rowdot.c` does
one thing, ``y = x @ w.T`` for a few rows of ``x``, as one sequential read of ``w`` per
core: the same pass took 17.6-21.3 ms through it against 23.1-29.6 ms packed (25-31 GB/s,
four runs), and on the 113 MB LM head alone it read as fast as ``Tensor.sum`` (29-32 GB/s).
Between the projections, what costs is dispatch: :mod:`norm.c` is the RMS norm in one
call where torch's takes seven ops (in alternating runs of one process, batch-1 decode
went from 18.6-19.3 to 17.7-18.0 ms a token), and :mod:`glue.c` the rotary embedding and
the SwiGLU, four or five ops each. :mod:`attention.c` is decode attention read from the
paged float16 pool in place, where torch's way is a gather, a widened copy and SDPA: on the
same EPYC batch-1 decode at a 4,096-token context went from 117 to 33 ms a token, at 64
tokens from 23.7 to 20.3.

The C files are compiled together with the system's C compiler (``$CC``, else ``cc``) and
``-O3 -march=native -fopenmp`` into ``$XDG_CACHE_HOME/kvgate/native`` (``~/.cache`` by
default), named by the digest of the sources, the flags, the compiler's version and the
CPU's model and flags, so that a cached library is only ever loaded on the machine kind it
was built for. A build is written to a temporary file and renamed, so workers starting
together never load half a file. Where there is no compiler, or the build fails,
:func:`load` returns None (logged once) and the model keeps torch's kernels.

The library links ``libgomp.so.1``; in a process that has loaded torch, that is torch's
own copy (the same soname), so the kernels run on the calling thread's OpenMP team with
torch's thread count, not on a second team competing for the cores.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import math
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCES = tuple(
    Path(__file__).with_name(name) for name in ("rowdot.c", "norm.c", "glue.c", "attention.c")
)
#: ``-ffp-contract=off``: a product is rounded before it is added, as torch rounds it (the
#: rotation's halves are then torch's to the bit)
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11", "-ffp-contract=off")
LIBS = ("-lm",)
#: seconds a build may take (it takes well under one)
BUILD_TIMEOUT_S = 60.0


def _check(what: str, *tensors: torch.Tensor) -> None:
    """Refuse what the kernels cannot take: other dtypes than float32, other devices.

    A plain loop over plain attributes: called a few hundred times a decode step, the
    generator expressions it had were 8% of the engine thread's time holding the GIL."""
    for t in tensors:
        if t.dtype is not torch.float32:
            raise TypeError(f"{what} takes float32, not {', '.join(str(t.dtype) for t in tensors)}")  # fmt: skip
        if not t.is_cpu:
            raise ValueError(f"{what} runs on the CPU")


def _bind(lib: ctypes.CDLL, name: str, *argtypes: type) -> Callable[..., None]:
    fn = getattr(lib, name)
    fn.restype = None
    fn.argtypes = list(argtypes)
    return fn


_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class RowDot:
    """``x @ weight.T`` for float32 CPU tensors through the compiled kernel."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = _bind(lib, "kvgate_rowdot", _P, _P, _P, _I, _I, _I)
        isa = lib.kvgate_rowdot_isa
        isa.restype = ctypes.c_char_p
        #: the instruction set the build used: ``avx512``, ``avx2`` or ``scalar``
        self.isa: str = isa().decode()

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``x`` ``[m, k]`` times ``weight`` ``[n, k]`` transposed: ``[m, n]``."""
        _check("rowdot", x, weight)
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


class RmsNorm:
    """``F.rms_norm(x, weight.shape, weight, eps)`` over the last dimension of float32 CPU
    rows, through the compiled kernel."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = _bind(lib, "kvgate_rms_norm", _P, _P, _P, _I, _I, _F)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """``x`` ``[..., n]`` normed by its rows and scaled by ``weight`` ``[n]``."""
        _check("rms_norm", x, weight)
        n = x.shape[-1]
        if weight.shape != (n,):
            raise ValueError(f"x has rows of {n}, the weight shape {tuple(weight.shape)}")
        x, weight = x.contiguous(), weight.contiguous()
        y = torch.empty_like(x)
        self._fn(x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.numel() // max(n, 1), n, eps)
        return y


class Rope:
    """The rotary embedding of the first heads of each row, in place."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = _bind(lib, "kvgate_rope", _P, _P, _P, _I, _I, _I, _I)

    def __call__(
        self, rows: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor
    ) -> None:
        """Rotate the first ``heads`` heads of ``head_dim`` floats of each row of ``rows``
        ``[T, width]`` (rows may be strided, their floats not) by ``cos`` and ``sin``, each
        ``T x head_dim / 2`` contiguous values (any shape: the model's ``[T, 1, D/2]``
        serves every layer of a step without a reshape per call): the halves ``(x1, x2)`` of a head become
        ``(x1 cos - x2 sin, x2 cos + x1 sin)``."""
        _check("rope", rows, cos, sin)
        tokens, half = rows.shape[0], head_dim // 2
        if rows.dim() != 2 or rows.stride(1) != 1 or rows.shape[1] < heads * head_dim:
            raise ValueError(f"rows {tuple(rows.shape)} must hold {heads} heads of {head_dim} each, contiguous within a row")  # fmt: skip
        if any(not t.is_contiguous() or t.numel() != tokens * half for t in (cos, sin)):
            raise ValueError(f"cos and sin must be contiguous, {tokens} x {half} values each")
        self._fn(rows.data_ptr(), cos.data_ptr(), sin.data_ptr(), tokens, heads, head_dim, rows.stride(0))  # fmt: skip


class SwiGLU:
    """``silu(g) * u`` of rows ``[g | u]``."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = _bind(lib, "kvgate_swiglu", _P, _P, _I, _I)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[m, 2n]`` to ``[m, n]``."""
        _check("swiglu", x)
        if x.dim() != 2 or x.shape[1] % 2:
            raise ValueError(f"swiglu takes rows of an even width, not {tuple(x.shape)}")
        x = x.contiguous()
        y = torch.empty((x.shape[0], x.shape[1] // 2), dtype=torch.float32)
        self._fn(x.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1] // 2)
        return y


class DecodeAttention:
    """Single-token rows attending over their contexts' slots in the paged pool, read in
    place (float16 or float32 KV, float32 queries and output)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        fn = lib.kvgate_decode_attention
        fn.restype = ctypes.c_int
        fn.argtypes = [_P, _I, _P, ctypes.c_int, _I, _P, _I, _P, _P, _P, _I, _I, _I, _I, _F]
        self._fn = fn
        block = lib.kvgate_attention_block
        block.restype = _I
        self._block = int(block())

    def __call__(
        self, q: torch.Tensor, slots: torch.Tensor, index: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        """``softmax(q K^T / sqrt(D)) V`` for each row ``b`` of ``q`` ``[B, heads * D]``
        (rows may be strided, their floats not) over the first ``lengths[b]`` slots of
        ``index[b]``, ``slots`` being one layer's view of the pool ``[S, 2, kv_heads, D]``
        (its rows strided, each row contiguous). Query head ``h`` reads KV head
        ``h // (heads / kv_heads)``. Returns ``[B, heads * D]``."""
        _check("decode attention", q)
        if slots.dtype not in (torch.float16, torch.float32) or slots.device.type != "cpu":
            raise TypeError(f"decode attention reads a float16 or float32 CPU pool, not {slots.dtype} on {slots.device}")  # fmt: skip
        _, two, kv_heads, d = slots.shape
        rows, width = q.shape
        if two != 2 or slots.stride()[1:] != (kv_heads * d, d, 1):
            raise ValueError(f"slots {tuple(slots.shape)} must be [S, 2, kv_heads, D] rows of contiguous K and V")  # fmt: skip
        if q.stride(1) != 1 or width % (kv_heads * d):
            raise ValueError(f"q rows of {width} floats do not hold query heads of {d} for {kv_heads} KV heads")  # fmt: skip
        if index.dtype != torch.int64 or lengths.dtype != torch.int64:
            raise TypeError("index and lengths are int64")
        if index.dim() != 2 or index.shape[0] != rows or lengths.shape != (rows,):
            raise ValueError(f"index must be [{rows}, L] and lengths [{rows}], not {tuple(index.shape)} and {tuple(lengths.shape)}")  # fmt: skip
        index, lengths = index.contiguous(), lengths.contiguous()
        group = width // (kv_heads * d)
        pieces = -(-index.shape[1] // self._block)  # for the longest row it may be given
        scratch = torch.empty(rows * pieces * kv_heads * group * (d + 2), dtype=torch.float32)
        out = torch.empty((rows, width), dtype=torch.float32)
        if self._fn(q.data_ptr(), q.stride(0), slots.data_ptr(), int(slots.dtype == torch.float16), slots.stride(0), index.data_ptr(), index.shape[1], lengths.data_ptr(), out.data_ptr(), scratch.data_ptr(), rows, kv_heads, group, d, 1.0 / math.sqrt(d)):  # fmt: skip
            raise ValueError(f"decode attention takes heads of at most 256 floats, at most 64 query heads and lengths in 1 .. {index.shape[1]}")  # fmt: skip
        return out


class Kernels:
    """The compiled kernels of one build."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        #: ``x @ weight.T`` for a few rows
        self.rowdot = RowDot(lib)
        #: the RMS norm of rows
        self.rms_norm = RmsNorm(lib)
        #: the rotary embedding, in place
        self.rope = Rope(lib)
        #: the MLP's gated activation
        self.swiglu = SwiGLU(lib)
        #: decode attention over the paged pool, read in place
        self.decode_attention = DecodeAttention(lib)


def cache_dir() -> Path:
    """Where builds are kept: ``$XDG_CACHE_HOME/kvgate/native``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvgate" / "native"


@functools.cache
def load() -> Kernels | None:
    """The kernels built for this machine (built now if need be), or None where they cannot
    be built or loaded; the reason is logged once."""
    try:
        return Kernels(ctypes.CDLL(str(_built(cache_dir()))))
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        log.warning("native: no compiled kernels (%s); the model keeps torch's", exc)
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
    """The library for these sources, compiler and CPU under ``directory``, built if missing."""
    cc = _compiler()
    version = subprocess.run(
        [cc, "--version"], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
    ).stdout
    digest = hashlib.sha256()
    for part in (
        *(src.read_bytes() for src in SOURCES),
        " ".join(FLAGS).encode(),
        version.encode(),
    ):
        digest.update(part)
    digest.update(_cpu_identity().encode())
    target = directory / f"kernels-{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".kernels-", suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run(
            [cc, *FLAGS, *map(str, SOURCES), "-o", tmp, *LIBS],
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
