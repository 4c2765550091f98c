"""The native kernels: ``x @ weight.T`` for any few rows and shapes and the RMS norm of
rows, built once per machine, and a clear None where they cannot be built."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from workers.engine import native
from workers.engine.native import build


def _kernels() -> native.Kernels:
    kernels = native.load()
    assert kernels is not None, "the native kernels did not build on this machine (see the log)"
    return kernels


def _rowdot() -> native.RowDot:
    return _kernels().rowdot


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize(("n", "k"), [(1, 1), (7, 15), (33, 16), (96, 37), (576, 1536)])
def test_rows_times_weight_transposed_for_every_shape(rows: int, n: int, k: int) -> None:
    """Row counts around the kernel's groups of four, widths around its 16 lanes."""
    g = torch.Generator().manual_seed(n * 1000 + k)
    x, weight = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
    got = _rowdot()(x, weight)
    expected = (x.double() @ weight.double().T).float()
    assert got.shape == (rows, n)
    assert torch.allclose(got, expected, atol=1e-5 * max(1, k) ** 0.5, rtol=1e-5)


def test_a_strided_row_is_read_as_its_values() -> None:
    """``x`` may be a view (a row of a wider batch): it is read by value, not by layout."""
    wide = torch.randn(3, 64)
    weight = torch.randn(8, 32)
    x = wide[:, ::2]
    assert torch.allclose(_rowdot()(x, weight), x @ weight.T, atol=1e-5)


def test_inputs_it_cannot_take_are_refused_with_what_to_fix() -> None:
    rowdot = _rowdot()
    with pytest.raises(TypeError, match="float32"):
        rowdot(torch.randn(1, 4, dtype=torch.float64), torch.randn(2, 4))
    with pytest.raises(ValueError, match="4 columns, the weight 5"):
        rowdot(torch.randn(1, 4), torch.randn(2, 5))
    with pytest.raises(ValueError, match="contiguous"):
        rowdot(torch.randn(1, 4), torch.randn(4, 2).T)


@pytest.mark.parametrize("rows", [1, 3, 64, 200])
@pytest.mark.parametrize("n", [1, 15, 576])
def test_rms_norm_is_torchs_for_every_row_count_and_width(rows: int, n: int) -> None:
    """Row counts on both sides of where the rows are spread over threads."""
    g = torch.Generator().manual_seed(rows * 1000 + n)
    x, weight = torch.randn(rows, n, generator=g) * 3, torch.randn(n, generator=g)
    got = _kernels().rms_norm(x, weight, 1e-5)
    assert got.shape == x.shape
    assert torch.allclose(got, F.rms_norm(x, (n,), weight, 1e-5), atol=1e-6, rtol=1e-5)


def test_rms_norm_reads_views_by_value_and_keeps_leading_dimensions() -> None:
    wide = torch.randn(2, 5, 64)
    weight = torch.randn(32)
    x = wide[..., ::2]
    got = _kernels().rms_norm(x, weight, 1e-6)
    assert got.shape == (2, 5, 32)
    assert torch.allclose(got, F.rms_norm(x, (32,), weight, 1e-6), atol=1e-6)


def test_rms_norm_refuses_what_it_cannot_take_with_what_to_fix() -> None:
    norm = _kernels().rms_norm
    with pytest.raises(TypeError, match="float32"):
        norm(torch.randn(1, 4, dtype=torch.float64), torch.randn(4), 1e-5)
    with pytest.raises(ValueError, match="rows of 4, the weight shape \\(5,\\)"):
        norm(torch.randn(1, 4), torch.randn(5), 1e-5)


@pytest.mark.parametrize("tokens", [1, 5, 70])
def test_rope_rotates_the_query_and_key_heads_in_place_as_torch_does(tokens: int) -> None:
    """Rows as the qkv buffer has them: 4 query-and-key heads of 8 rotated, the 2 value
    heads after them left alone; to the bit, since products are rounded before they add."""
    g = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, 6 * 8, generator=g)
    angles = torch.randn(tokens, 1, 4, generator=g)
    cos, sin = angles.cos(), angles.sin()
    expected = qkv.clone()
    qk = expected[:, :32].view(tokens, 4, 8)
    x1, x2 = qk[..., :4], qk[..., 4:]
    r1 = x1 * cos - x2 * sin
    x2.mul_(cos).addcmul_(x1, sin)
    x1.copy_(r1)
    _kernels().rope(qkv, 4, 8, cos, sin)
    assert torch.equal(qkv, expected)


def test_rope_refuses_rows_too_narrow_for_its_heads() -> None:
    with pytest.raises(ValueError, match="must hold 4 heads of 8"):
        _kernels().rope(torch.randn(2, 24), 4, 8, torch.ones(2, 4), torch.zeros(2, 4))


@pytest.mark.parametrize("rows", [1, 3, 40])
def test_swiglu_is_silu_of_the_gate_times_the_up_half(rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 2 * 96, generator=g) * 4
    expected = F.silu(x[:, :96]) * x[:, 96:]
    assert torch.allclose(_kernels().swiglu(x), expected, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="even width"):
        _kernels().swiglu(torch.randn(2, 7))


def test_swiglu_holds_at_the_ends_of_the_exponential() -> None:
    """Gates far out on both sides (where e^-g would overflow, or e^g underflow to 0), at
    zero, and off the kernel's sixteen lanes: silu as torch computes it, infinities too."""
    gate = torch.tensor([-1e4, -100.0, -87.5, -30.0, -1e-30, -0.0, 0.0, 1e-30, 0.5, 30.0])
    gate = torch.cat([gate, torch.linspace(-90, 90, 27), torch.tensor([float("inf")])])
    up = torch.linspace(-3, 3, gate.numel())
    got = _kernels().swiglu(torch.cat([gate, up])[None])
    assert torch.allclose(got, F.silu(gate)[None] * up, atol=1e-6, rtol=1e-6)


def test_a_build_is_made_once_and_reused(tmp_path: Path) -> None:
    first = build.built(tmp_path)
    made = first.stat().st_mtime_ns
    assert build.built(tmp_path) == first
    assert first.stat().st_mtime_ns == made
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary file left


def test_without_a_compiler_there_is_no_kernel_and_the_log_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler")
    with caplog.at_level("WARNING", logger=native.__name__):
        assert native.load.__wrapped__() is None
    assert "no C compiler ('no-such-compiler'" in caplog.text


def test_a_failed_build_leaves_nothing_behind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A compiler that fails (``false`` exits 1 for any arguments) raises, and neither a
    library nor its temporary file stays to be loaded later."""
    monkeypatch.setenv("CC", "false")
    with pytest.raises(RuntimeError, match="failed"):
        build.built(tmp_path)
    assert list(tmp_path.iterdir()) == []
