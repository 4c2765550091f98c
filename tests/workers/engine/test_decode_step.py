"""Batch-1 decode in one compiled call (``decode_step.c``) gives the op-by-op path's bits:
the same logits and the same KV in the pool, step after step, float16 and float32 pools,
contexts on both sides of attention's 256-key pieces; and it refuses what it cannot take."""

from __future__ import annotations

import functools

import pytest
import torch

from tests.support.engine import TinyModel, tiny_llama
from workers.engine import model as model_module
from workers.engine import native
from workers.engine.batch import SeqChunk, build_batch
from workers.engine.kv_pool import KVPool
from workers.engine.model import LlamaModel
from workers.engine.projection import choose_single_row_kernel

PAGE = 16


def _native_wins(projections, threads):  # type: ignore[no-untyped-def]
    """The single-row choice as the model makes it, with the native kernel timed faster."""
    return choose_single_row_kernel(
        projections, threads, timer=lambda ps, kernel, t: 1.0 if kernel == "packed" else 0.5
    )


@pytest.fixture
def native_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    if native.load() is None:
        pytest.fail("the native kernels did not build on this machine (see the log)")
    monkeypatch.setattr(model_module, "choose_single_row_kernel", _native_wins)


def _model(tiny: TinyModel, kv_dtype: torch.dtype) -> LlamaModel:
    return LlamaModel(tiny.config, tiny.state_dict, kv_dtype=kv_dtype)


def _pool(tiny: TinyModel, kv_dtype: torch.dtype) -> KVPool:
    per_page = tiny.config.kv_bytes_per_token(kv_dtype.itemsize) * PAGE
    return KVPool(tiny.config, pool_bytes=per_page * 40, page_size=PAGE, dtype=kv_dtype)


def _step(model: LlamaModel, pool: KVPool, ids: list[int], start: int, pages: list[int]):  # type: ignore[no-untyped-def]
    batch, _ = build_batch(
        [SeqChunk(ids, start, pages)],
        page_size=PAGE,
        page_stride=pool.page_stride,
        device=torch.device("cpu"),
        dtype=pool.kv.dtype,
    )
    return model.forward(batch, pool)


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float32])
@pytest.mark.usefixtures("native_wins")
def test_one_call_decode_gives_the_op_by_op_bits(kv_dtype: torch.dtype) -> None:
    tiny = tiny_llama(seed=4)
    fused, plain = _model(tiny, kv_dtype), _model(tiny, kv_dtype)
    assert fused._decode_layers is not None
    plain._decode_layers = None
    pools = _pool(tiny, kv_dtype), _pool(tiny, kv_dtype)
    pages = pools[0].alloc(18)
    assert pools[1].alloc(18) == pages
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(3, 512, (250,), generator=g).tolist()
    for model, pool in zip((fused, plain), pools, strict=True):
        _step(model, pool, prompt, 0, pages)  # the prefill is op by op in both
    assert torch.equal(pools[0].kv, pools[1].kv)
    token = 7
    for position in range(250, 270):  # the context crosses 256 keys: two pieces
        got, expected = (
            _step(model, pool, [token], position, pages)
            for model, pool in zip((fused, plain), pools, strict=True)
        )
        assert torch.equal(got, expected), f"logits differ at position {position}"
        assert torch.equal(pools[0].kv, pools[1].kv), f"KV differs at position {position}"
        token = int(got[0].argmax())


@pytest.mark.usefixtures("native_wins")
def test_a_step_of_several_rows_or_a_prefill_stays_op_by_op() -> None:
    """Only a lone decode row takes the one call: a batch of two rows gives what two lone
    rows give only to rounding, so it must not go through it (nor would it fit)."""
    tiny = tiny_llama(seed=5)
    model = _model(tiny, torch.float16)
    calls: list[int] = []
    one_call = model._decode_layers
    assert one_call is not None
    model._decode_layers = lambda h, slots, kv: calls.append(slots.shape[1]) or one_call(h, slots, kv)  # type: ignore[assignment,func-returns-value]  # fmt: skip
    pool = _pool(tiny, torch.float16)
    pages = [pool.alloc(1), pool.alloc(1)]
    for row, ids in enumerate(([5, 6, 7], [8, 9])):
        _step(model, pool, ids, 0, pages[row])
    assert calls == []
    batch, _ = build_batch(
        [SeqChunk([10], 3, pages[0]), SeqChunk([11], 2, pages[1])],
        page_size=PAGE,
        page_stride=pool.page_stride,
        device=torch.device("cpu"),
        dtype=torch.float16,
    )
    model.forward(batch, pool)
    assert calls == []
    _step(model, pool, [12], 4, pages[0])
    assert calls == [5]


def test_where_packed_weights_win_decode_stays_op_by_op(monkeypatch: pytest.MonkeyPatch) -> None:
    packed_wins = functools.partial(
        choose_single_row_kernel, timer=lambda ps, kernel, t: 1.0 if kernel == "native" else 0.5
    )
    monkeypatch.setattr(model_module, "choose_single_row_kernel", packed_wins)
    assert _model(tiny_llama(seed=6), torch.float16)._decode_layers is None


@pytest.mark.usefixtures("native_wins")
def test_the_one_call_refuses_what_it_cannot_take() -> None:
    tiny = tiny_llama(seed=7)
    model = _model(tiny, torch.float16)
    one_call = model._decode_layers
    assert one_call is not None
    pool = _pool(tiny, torch.float16)
    h = torch.zeros(1, tiny.config.hidden_size)
    with pytest.raises(ValueError, match=r"not 1 \.\. 1024"):
        one_call(h, torch.zeros(1, 1025, dtype=torch.int64), pool.kv)
    with pytest.raises(ValueError, match=r"not 1 \.\. 1024"):
        one_call(h, torch.zeros(1, 0, dtype=torch.int64), pool.kv)
    with pytest.raises(ValueError, match="pool"):
        one_call(h, torch.zeros(1, 3, dtype=torch.int64), pool.kv[:, :1])
    with pytest.raises(TypeError, match="float16 or float32"):
        one_call(h, torch.zeros(1, 3, dtype=torch.int64), pool.kv.to(torch.bfloat16))
    with pytest.raises(ValueError, match="one contiguous row"):
        one_call(torch.zeros(2, tiny.config.hidden_size), torch.zeros(1, 3, dtype=torch.int64), pool.kv)  # fmt: skip
    pages = pool.kv.shape[0]
    past_the_pool = (pages * 2 - 1) * PAGE  # the last layer's view of the pool ends there
    for slot in (past_the_pool, -1):
        with pytest.raises(ValueError, match=f"outside the pool's {pages} pages"):
            one_call(h, torch.tensor([[0, slot, 1]]), pool.kv)
    assert not pool.kv.any()  # nothing was written
    one_call(h, torch.tensor([[0, past_the_pool - 1]]), pool.kv)  # the last slot is in it
    first = model.layers[0]
    wrong = native.LayerWeights(
        attn_norm=first.attn_norm,
        qkv=first.qkv.row_major,
        o=first.o.row_major[:, :8].contiguous(),
        mlp_norm=first.mlp_norm,
        gate_up=first.gate_up.row_major,
        down=first.down.row_major,
    )
    with pytest.raises(ValueError, match="contiguous weights shaped"):
        model._kernels.decode_layers(  # type: ignore[union-attr]
            [wrong], heads=4, kv_heads=2, eps=1e-5, cos=model.cos, sin=model.sin
        )
