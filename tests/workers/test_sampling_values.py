"""Sampling values over HTTP: what would fail the engine's shared step is a 400 naming the
field, and values it can normalise (a tiny temperature, a huge top_k) are served."""

from __future__ import annotations

import httpx
import pytest

from tests.support.worker import GREEDY, MODEL, complete

_NATIVE_TEXT = {"text": "x"}


# Sampling values that used to pass validation and then fail the engine's shared step,
# ending every request on the worker with ``abort`` (a 64-bit-overflowing seed left its own
# request waiting forever); now each is a 400 naming its field.
@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "x", "stop_token_ids": [10**9], "min_tokens": 1},
            "stop_token_ids",
            "token ids must be in [0, 49152)",
        ),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "seed": 2**64}, "seed", "64 bits"),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "seed": -(2**63) - 1},
            "seed",
            "64 bits",
        ),
        (
            "/generate",
            _NATIVE_TEXT | {"sampling_params": {"stop_token_ids": [49152], "min_new_tokens": 1}},
            "stop_token_ids",
            "token ids must be in",
        ),
        (
            "/generate",
            _NATIVE_TEXT | {"sampling_params": {"stop_token_ids": [-1]}},
            "stop_token_ids",
            "token ids must be in",
        ),
        (
            "/generate",
            _NATIVE_TEXT | {"sampling_params": {"sampling_seed": 2**64}},
            "sampling_params.sampling_seed",
            "64 bits",
        ),
        (
            "/generate",
            _NATIVE_TEXT | {"sampling_params": {"temperature": 1e300, "min_new_tokens": 1}},
            "temperature",
            "not a finite number",
        ),
        (
            "/generate",
            b'{"text": "x", "sampling_params": {"temperature": Infinity, "min_new_tokens": 1}}',
            "sampling_params.temperature",
            "finite number",
        ),
    ],
)
async def test_sampling_values_a_step_cannot_take_get_400_naming_the_param(
    worker_client: httpx.AsyncClient, path: str, body: object, param: str, words: str
) -> None:
    if isinstance(body, bytes):
        resp = await worker_client.post(path, content=body)
    else:
        resp = await worker_client.post(path, json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param
    assert words in error["message"]
    assert error["type"] == "invalid_request_error"


async def test_tiny_temperature_is_greedy_and_a_huge_top_k_keeps_every_token(
    worker_client: httpx.AsyncClient,
) -> None:
    """Both used to fail the engine's step (1e-46 is 0.0 in float32; 2**63 overflowed the
    top-k tensor), so the request ended with ``abort`` instead of text."""
    want = (await complete(worker_client, prompt="Hello", max_tokens=6, **GREEDY)).json()[
        "choices"
    ][0]
    tiny = await complete(
        worker_client, prompt="Hello", max_tokens=6, temperature=1e-46, ignore_eos=True
    )
    assert tiny.status_code == 200, tiny.text
    assert tiny.json()["choices"][0] == want
    huge = await complete(
        worker_client, prompt="Hello", max_tokens=6, top_k=2**63, seed=1, ignore_eos=True
    )
    assert huge.status_code == 200, huge.text
    assert huge.json()["choices"][0]["finish_reason"] == "length"
    params = {"temperature": 1e-46, "top_k": 2**63, "max_new_tokens": 6, "ignore_eos": True}
    native = await worker_client.post(
        "/generate", json={"text": "Hello", "sampling_params": params}
    )
    assert native.status_code == 200, native.text
    assert native.json()["text"] == want["text"]
    assert native.json()["meta_info"]["finish_reason"] == {"type": "length"}
