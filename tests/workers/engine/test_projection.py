"""The weight matmuls: every kernel computes ``x @ weight.T``, one row takes the native
kernel only where it was measured faster, and oneDNN's caches stay bounded."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Sequence

import pytest
import torch

from tests.support.engine import tiny_llama
from workers.engine import native
from workers.engine import projection as projection_module
from workers.engine.model import LlamaModel
from workers.engine.projection import (
    SINGLE_ROW_MARGIN,
    Projection,
    choose_single_row_kernel,
    fastest_pass,
)

ONEDNN = torch.backends.mkldnn.is_available()


def _weights() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=g) for shape in ((48, 32), (32, 48), (96, 32))]


def _projection(weight: torch.Tensor) -> Projection:
    kernels = native.load()
    assert kernels is not None, "the native kernels did not build on this machine (see the log)"
    return Projection(weight, rowdot=kernels.rowdot)


def _timer(packed: float, native_s: float):
    """A :data:`~workers.engine.projection.PassTimer` that reports fixed times and records
    what it was asked to time."""
    asked: list[tuple[int, str, int]] = []

    def timer(projections: Sequence[Projection], kernel: str, threads: int) -> float:
        asked.append((len(projections), kernel, threads))
        return packed if kernel == "packed" else native_s

    return timer, asked


@pytest.mark.skipif(not ONEDNN, reason="torch without oneDNN packs nothing")
@pytest.mark.parametrize("rows", [1, 2, 8])
def test_every_kernel_computes_x_times_weight_transposed(rows: int) -> None:
    for weight in _weights():
        p = _projection(weight)
        assert p.packed is not None and p.row_major is not None and p.weight is None
        x = torch.randn(rows, weight.shape[1])
        expected = x @ weight.T
        for out in (p(x), p.by_packed(x), p.by_native(x)):
            assert out.shape == expected.shape
            assert torch.allclose(out, expected, atol=1e-5)


@pytest.mark.skipif(not ONEDNN, reason="torch without oneDNN packs nothing")
def test_row_major_weights_stay_only_when_the_native_kernel_wins_by_the_margin() -> None:
    kept = [_projection(w) for w in _weights()]
    timer, asked = _timer(packed=1.0, native_s=SINGLE_ROW_MARGIN)
    choice = choose_single_row_kernel(kept, threads=3, timer=timer)
    assert choice is not None and choice.native
    assert all(p.row_major is not None for p in kept)
    assert sorted(asked) == [(3, "native", 3), (3, "packed", 3)]
    assert choice.describe().startswith(f"one row: native kernel ({choice.isa})")

    dropped = [_projection(w) for w in _weights()]
    timer, _ = _timer(packed=1.0, native_s=SINGLE_ROW_MARGIN + 0.01)
    choice = choose_single_row_kernel(dropped, threads=2, timer=timer)
    assert choice is not None and not choice.native
    assert all(p.row_major is None for p in dropped)
    assert "dropped" in choice.describe()
    for weight, p in zip(_weights(), dropped, strict=True):  # one row now goes packed
        x = torch.randn(1, weight.shape[1])
        assert torch.allclose(p(x), x @ weight.T, atol=1e-5)


def test_nothing_is_timed_where_there_is_no_choice() -> None:
    """float64 weights are not packed: plain ``F.linear``, no copy, no timing."""
    plain = [_projection(w.double()) for w in _weights()]
    timer, asked = _timer(packed=1.0, native_s=0.1)
    assert choose_single_row_kernel(plain, threads=2, timer=timer) is None
    assert asked == []
    assert all(p.packed is None and p.row_major is None for p in plain)
    x = torch.randn(1, 32, dtype=torch.float64)
    assert torch.allclose(plain[0](x), x @ _weights()[0].double().T)


@pytest.mark.skipif(not ONEDNN, reason="torch without oneDNN packs nothing")
def test_timing_runs_on_its_own_thread_with_the_engines_thread_count() -> None:
    """The caller keeps its torch thread count; the passes ran with the one asked for."""
    seen: list[tuple[str, int]] = []
    kernels = native.load()
    assert kernels is not None
    rowdot = kernels.rowdot

    def spy(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return rowdot(x, weight)

    projections = [Projection(w, rowdot=spy) for w in _weights()]  # type: ignore[arg-type]
    before = torch.get_num_threads()
    seconds = fastest_pass(projections, "native", threads=1)
    assert seconds > 0
    assert torch.get_num_threads() == before
    assert seen and all(s == ("projection-timing", 1) for s in seen)
    assert len(seen) == len(projections) * (projection_module.SINGLE_ROW_PASSES + 1)


def test_packed_weights_bound_onednns_caches_unless_the_environment_did(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """oneDNN and ideep keep 1,024 shapes each by default, 1-2 MB apiece: a worker serving
    every prompt length grew by gigabytes. The first packed weight bounds both caches;
    an operator's own setting stands."""
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "8")
    monkeypatch.setattr(projection_module, "_bound_onednn_caches", _fresh_bound())
    x = torch.randn(3, 4)
    weight = torch.randn(5, 4)
    assert torch.allclose(Projection(weight)(x), x @ weight.T, atol=1e-5)
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(
        projection_module.ONEDNN_CACHE_ENTRIES
    )
    assert os.environ["LRU_CACHE_CAPACITY"] == "8"


def _fresh_bound():
    """The module's once-only setter, with its memory of having run forgotten."""
    return functools.cache(projection_module._bound_onednn_caches.__wrapped__)


@pytest.mark.skipif(not ONEDNN, reason="torch without oneDNN packs nothing")
def test_a_model_keeps_no_row_major_weights_without_the_memory_for_them(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The bytes weighed are the projections' and the tied head's; with less memory
    available than ROOM_FACTOR times them, none is kept and nothing is timed, and one row
    goes through the packed weights to the same result."""
    tiny = tiny_llama()
    weighed = sum(
        t.numel() * 4
        for n, t in tiny.state_dict.items()
        if n.endswith("_proj.weight") or n == "model.embed_tokens.weight"
    )

    def model_with(available: int) -> LlamaModel:
        memory = type("Memory", (), {"available": available})
        monkeypatch.setattr(projection_module.psutil, "virtual_memory", lambda: memory)
        return LlamaModel(tiny.config, tiny.state_dict, device="cpu", dtype=torch.float32)

    roomy = model_with(projection_module.ROOM_FACTOR * weighed)
    assert roomy.single_row is not None  # kept and timed (staying or not: the timing's)
    with caplog.at_level("WARNING", logger=projection_module.__name__):
        short = model_with(projection_module.ROOM_FACTOR * weighed - 1)
    assert short.single_row is None
    projections = [(layer.qkv, layer.o, layer.gate_up, layer.down) for layer in short.layers]
    assert all(p.row_major is None for four in projections for p in four)
    assert short.lm_head.row_major is None
    assert "the native kernel not tried" in caplog.text
    x = torch.randn(1, tiny.config.hidden_size)
    head = tiny.state_dict["model.embed_tokens.weight"]
    assert torch.allclose(short.lm_head(x), x @ head.T, atol=1e-5)
