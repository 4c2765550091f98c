"""Any JSON a client can send is either a request or a RequestError naming what to fix: the
schema never fails in another way, at the gateway or at a worker (seeded, bounded)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import inbound
from gateway.accounts import Plan
from gateway.errors import ApiError
from protocol.openai_requests import (
    ChatCompletionRequest,
    CompletionRequest,
    RequestError,
    parse_body,
)

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True)
PLAN = Plan("p", 10, 1000, 10_000, 2, 100, 4000)

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
    st.text(max_size=20),
)  # fmt: skip
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = [
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "stream",
    "stream_options", "n", "temperature", "top_p", "top_k", "stop", "seed", "logprobs",
    "tools", "response_format", "min_tokens", "stop_token_ids", "ignore_eos", "echo",
]  # fmt: skip
bodies = st.fixed_dictionaries(
    {},
    optional={
        **{name: json_values for name in FIELDS},
        "messages": st.lists(
            st.fixed_dictionaries({}, optional={"role": json_values | st.sampled_from(
                ["user", "system", "assistant", "tool"]), "content": json_values}),
            max_size=3,
        ),
    },
)  # fmt: skip


@SETTINGS
@given(bodies)
def test_any_body_is_a_request_or_a_request_error(body: dict) -> None:
    raw = json.dumps(body).encode()
    for model in (ChatCompletionRequest, CompletionRequest):
        try:
            parse_body(model, raw)
        except RequestError as exc:
            assert exc.status == 400 and exc.message


@SETTINGS
@given(bodies, st.booleans())
def test_the_gateway_answers_any_body_with_a_request_or_a_4xx(body: dict, chat: bool) -> None:
    try:
        inbound.parse(json.dumps(body).encode(), chat=chat, plan=PLAN)
    except ApiError as exc:
        assert 400 <= exc.status < 500 and exc.message
