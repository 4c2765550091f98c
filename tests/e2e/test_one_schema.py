"""One request schema: a body the gateway admits is a body the built-in worker serves.

The same bodies go through the gateway's parser (with a plan that limits nothing these
bodies ask for) and, as the gateway would forward them, through the real worker app. Where
the gateway refuses a body, the worker must refuse it too, for the same field.
"""

from __future__ import annotations

import json

import httpx
import pytest

from gateway import inbound
from gateway.accounts import Plan
from gateway.errors import ApiError
from tests.support.worker import MODEL

#: a plan whose limits none of the bodies below reach
PLAN = Plan("wide", 10**6, 10**9, 10**9, 100, 64, 10**6)

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
TEXT = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}

ACCEPTED = [
    {},
    {"stream": True},
    {"stream": True, "stream_options": {"include_usage": True}},
    {"n": 1},
    {"n": 3},
    {"n": 2, "stream": True, "stream_options": {"include_usage": True}},
    {"seed": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 5},
    {"stop": ["x", "y"]},
    {"min_tokens": 1, "ignore_eos": True},
    {"user": "someone", "unknown_field": {"deep": [1, 2]}},
    {"max_completion_tokens": 2},
    {"logprobs": False},
    {"logprobs": True, "top_logprobs": 3},
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        ]
    },
]
REFUSED = [
    ({"n": 9}, "n"),
    ({"n": True}, "n"),
    ({"stream": "yes"}, "stream"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"model": ""}, "model"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user"}]}, "messages.0"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"stop": [""]}, "stop"),
    ({"seed": 2**70}, "seed"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": "yes"}, "logprobs"),
]
TEXT_ACCEPTED = [
    {},
    {"prompt": [1, 2, 3]},
    {"prompt": ["Hi"]},
    {"stream": True},
    {"logprobs": 2},
]
TEXT_REFUSED = [
    ({"logprobs": 6}, "logprobs"),
    ({"logprobs": True}, "logprobs"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"echo": True}, None),
    ({"prompt": [-1]}, "prompt"),
]

CASES = [
    *[(True, CHAT | extra, None) for extra in ACCEPTED],
    *[(True, CHAT | extra, param or "") for extra, param in REFUSED],
    *[(False, TEXT | extra, None) for extra in TEXT_ACCEPTED],
    *[(False, TEXT | extra, param or "") for extra, param in TEXT_REFUSED],
]


@pytest.mark.parametrize(("chat", "body", "refused_param"), CASES, ids=lambda v: str(v)[:60])
async def test_gateway_and_worker_agree(
    worker_client: httpx.AsyncClient, chat: bool, body: dict, refused_param: str | None
) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    raw = json.dumps(body).encode()
    try:
        admitted = inbound.parse(raw, chat=chat, plan=PLAN)
    except ApiError as refusal:
        assert refused_param is not None, f"the gateway refused a good body: {refusal}"
        assert refusal.status == 400
        if refused_param:
            assert refusal.param == refused_param
        worker = await worker_client.post(path, content=raw)
        assert worker.status_code == 400, worker.text
        if refused_param:
            assert worker.json()["error"]["param"] == refused_param
        return
    assert refused_param is None, f"the gateway admitted {body}"
    forwarded = admitted.upstream_body("tenant-salt")
    worker = await worker_client.post(path, content=forwarded)
    assert worker.status_code == 200, worker.text
