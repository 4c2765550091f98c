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

They are compiled for this machine on first use (:mod:`.build`); where there is no
compiler, or the build fails, :func:`load` returns None (logged once) and the model keeps
torch's kernels. :mod:`decode_step.c` runs all of a lone decode row's layers in one call,
from the same kernels (:class:`DecodeLayers`): batch-1 decode went from 61.8 to 73.4 tok/s
(medians of 12 alternating pairs in one process, faster in all 12).

The library links ``libgomp.so.1``; in a process that has loaded torch, that is torch's
own copy (the same soname), so the kernels run on the calling thread's OpenMP team with
torch's thread count, not on a second team competing for the cores.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from workers.engine.native import build

log = logging.getLogger(__name__)


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
        #: keys per piece of the work (the caller's scratch holds each piece's results)
        self.block = int(block())

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
        pieces = -(-index.shape[1] // self.block)  # for the longest row it may be given
        scratch = torch.empty(rows * pieces * kv_heads * group * (d + 2), dtype=torch.float32)
        out = torch.empty((rows, width), dtype=torch.float32)
        if self._fn(q.data_ptr(), q.stride(0), slots.data_ptr(), int(slots.dtype == torch.float16), slots.stride(0), index.data_ptr(), index.shape[1], lengths.data_ptr(), out.data_ptr(), scratch.data_ptr(), rows, kv_heads, group, d, 1.0 / math.sqrt(d)):  # fmt: skip
            raise ValueError(f"decode attention takes heads of at most 256 floats, at most 64 query heads and lengths in 1 .. {index.shape[1]}")  # fmt: skip
        return out


class _LayerWeights(ctypes.Structure):
    _fields_ = [(n, _P) for n in ("attn_norm", "qkv", "o", "mlp_norm", "gate_up", "down")]


class _Model(ctypes.Structure):
    _fields_ = [
        ("layers", _P),
        *((n, _I) for n in ("n_layers", "hidden", "heads", "kv_heads", "head_dim", "inter")),
        ("eps", _F),
        ("cos", _P),
        ("sin", _P),
        ("positions", _I),
        ("scratch", _P),
    ]


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's float32 weights as :class:`DecodeLayers` reads them: the norms'
    scales and the projections row-major (``[out, in]``), q/k/v and gate/up fused."""

    attn_norm: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    mlp_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


class DecodeLayers:
    """Every decoder layer of a single-token row in one compiled call (``decode_step.c``),
    for one model's weights: the same kernels, in the same order, as the op-by-op path, so
    the same bits, without its ~270 calls a step."""

    def __init__(
        self,
        lib: ctypes.CDLL,
        layers: Sequence[LayerWeights],
        *,
        heads: int,
        kv_heads: int,
        eps: float,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> None:
        """``cos``, ``sin``: the rotary tables ``[positions, head_dim / 2]``."""
        self._fn = lib.kvgate_decode_layers
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [_P, _P, _P, _I, _P, ctypes.c_int, _I, _I]
        if not layers:
            raise ValueError("decode layers take at least one layer")
        qkv, gate_up = layers[0].qkv, layers[0].gate_up
        hidden, inter = qkv.shape[1], gate_up.shape[0] // 2
        head_dim = qkv.shape[0] // (heads + 2 * kv_heads)
        for layer in layers:
            _check("decode layers", *(getattr(layer, f.name) for f in fields(layer)))
            shapes = {f.name: tuple(getattr(layer, f.name).shape) for f in fields(layer)}
            wanted = {
                "attn_norm": (hidden,),
                "qkv": ((heads + 2 * kv_heads) * head_dim, hidden),
                "o": (hidden, heads * head_dim),
                "mlp_norm": (hidden,),
                "gate_up": (2 * inter, hidden),
                "down": (hidden, inter),
            }
            if shapes != wanted or not all(getattr(layer, n).is_contiguous() for n in wanted):
                raise ValueError(f"decode layers take contiguous weights shaped {wanted}, not {shapes}")  # fmt: skip
        _check("decode layers", cos, sin)
        if cos.shape != sin.shape or cos.shape[1:] != (head_dim // 2,) or not (cos.is_contiguous() and sin.is_contiguous()):  # fmt: skip
            raise ValueError(f"cos and sin must be contiguous [positions, {head_dim // 2}]")
        takes = lib.kvgate_attention_takes
        takes.restype, takes.argtypes = ctypes.c_int, [_I, _I, _I]
        if heads % kv_heads or not takes(kv_heads, heads // kv_heads, head_dim):
            raise ValueError(f"decode attention does not take {heads} heads of {head_dim} over {kv_heads}")  # fmt: skip
        self._pool_dims = (len(layers), 2, kv_heads, head_dim)
        positions = cos.shape[0]
        block = lib.kvgate_attention_block
        block.restype = _I
        pieces = -(-positions // int(block()))
        work = hidden + (heads + 2 * kv_heads) * head_dim + heads * head_dim + 3 * inter
        # kept: the C side holds their addresses
        self._keep = (tuple(layers), cos, sin)
        self._scratch = torch.empty(work + pieces * heads * (head_dim + 2), dtype=torch.float32)
        self._layers = (_LayerWeights * len(layers))(
            *(_LayerWeights(*(getattr(w, f.name).data_ptr() for f in fields(w))) for w in layers)
        )
        self._model = _Model(
            ctypes.addressof(self._layers), len(layers), hidden, heads, kv_heads, head_dim,
            inter, eps, cos.data_ptr(), sin.data_ptr(), positions, self._scratch.data_ptr(),
        )  # fmt: skip

    def __call__(self, h: torch.Tensor, slots: torch.Tensor, pool: torch.Tensor) -> None:
        """Run every layer over ``h`` (``[1, hidden]``, the token's embedding; the last
        layer's output when it returns), the token being the last of the context whose
        pool slots are ``slots`` (``[1, length]`` int64, a layer's slot numbering: see
        :class:`~workers.engine.kv_pool.KVPool`); its K and V are written into ``pool``
        (``KVPool.kv``, float16 or float32) at the last slot."""
        _check("decode layers", h)
        if pool.dtype not in (torch.float16, torch.float32) or not pool.is_cpu:
            raise TypeError(f"decode layers write a float16 or float32 CPU pool, not {pool.dtype}")  # fmt: skip
        if pool.dim() != 6 or (pool.shape[1], *pool.shape[3:]) != self._pool_dims or not pool.is_contiguous():  # fmt: skip
            layers, _, kv_heads, head_dim = self._pool_dims
            raise ValueError(f"the pool {tuple(pool.shape)} is not [pages, {layers}, page_size, 2, {kv_heads}, {head_dim}]")  # fmt: skip
        if h.shape != (1, self._model.hidden) or not h.is_contiguous():
            raise ValueError(f"h must be one contiguous row of {self._model.hidden}")
        if slots.dtype != torch.int64 or slots.dim() != 2 or slots.shape[0] != 1 or not slots.is_contiguous():  # fmt: skip
            raise ValueError("slots must be one contiguous int64 row")
        length = slots.shape[1]
        failed = self._fn(ctypes.addressof(self._model), h.data_ptr(), slots.data_ptr(), length, pool.data_ptr(), int(pool.dtype == torch.float16), pool.shape[0], pool.shape[2])  # fmt: skip
        if failed == -1:
            raise ValueError(f"a context of {length} tokens is not 1 .. {self._model.positions}")  # fmt: skip
        if failed:
            raise ValueError(f"a slot of the context lies outside the pool's {pool.shape[0]} pages")  # fmt: skip


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
        self._lib = lib

    def decode_layers(self, layers: Sequence[LayerWeights], **shape: Any) -> DecodeLayers:
        """Every decoder layer of one single-token row in one call, over ``layers``
        (keywords: see :class:`DecodeLayers`)."""
        return DecodeLayers(self._lib, layers, **shape)


@functools.cache
def load() -> Kernels | None:
    """The kernels built for this machine (built now if need be), or None where they cannot
    be built or loaded; the reason is logged once."""
    try:
        return Kernels(ctypes.CDLL(str(build.built(build.cache_dir()))))
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        log.warning("native: no compiled kernels (%s); the model keeps torch's", exc)
        return None
