"""Pure parts of the gateway: routing bounds, circuit breaker, client IP, request parsing,
relaying a worker's stream."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import AsyncIterator

import orjson
import pytest

from gateway import inbound, proxy
from gateway.accounts import Plan
from gateway.breaker import Breaker
from gateway.client_ip import client_ip, free_tier_key
from gateway.errors import ApiError
from gateway.proxy import Outcome
from gateway.router import Router, bound
from protocol.openai_requests import CompletionRequest
from protocol.registry import WorkerInfo

PLAN = Plan("t", 10, 1000, 10_000, 2, 100, 1000)


def _workers(n: int, model: str = "m") -> list[WorkerInfo]:
    return [WorkerInfo(f"w{i}", f"http://w{i}", model, 8, 0) for i in range(n)]


def test_new_sessions_never_push_a_worker_above_the_bound() -> None:
    router = Router(1.25)
    router.update(_workers(4))
    for k in range(1, 41):
        chosen = router.choose("m", f"s{k}", lambda w: True)
        assert chosen is not None
        router.acquire(chosen.worker_id)
        assert max(router.inflight().values()) <= bound(k, 4, 1.25)


def test_one_hot_session_spills_over_once_its_worker_runs_hot() -> None:
    router = Router(1.25)
    router.update(_workers(4))
    for k in range(1, 41):
        router.acquire(router.choose("m", "flood", lambda w: True).worker_id)
        assert max(router.inflight().values()) <= 1.25 * k / 4 + 2 + 1


def test_sessions_stick_and_only_the_removed_workers_sessions_move() -> None:
    router = Router(1.25)
    router.update(_workers(3))
    first = {s: router.choose("m", f"s{s}", lambda w: True).worker_id for s in range(30)}
    again = {s: router.choose("m", f"s{s}", lambda w: True).worker_id for s in range(30)}
    assert first == again
    router.update(_workers(3)[:2])
    moved = {s: router.choose("m", f"s{s}", lambda w: True).worker_id for s in range(30)}
    assert all(moved[s] == first[s] for s in first if first[s] != "w2")
    assert "w2" not in moved.values()


def test_unusable_and_unknown() -> None:
    router = Router(1.25)
    router.update(_workers(2))
    assert router.choose("other", "s", lambda w: True) is None
    assert router.choose("m", "s", lambda w: False) is None
    assert router.choose("m", "s", lambda w: w == "w1").worker_id == "w1"
    assert router.models() == ["m"]


def test_breaker_opens_after_failures_and_retries_later() -> None:
    now = [0.0]
    breaker = Breaker(failures=2, open_s=5, clock=lambda: now[0])
    breaker.failure("w")
    assert breaker.allows("w")
    breaker.failure("w")
    assert not breaker.allows("w") and breaker.allows("other")
    now[0] = 6
    assert breaker.allows("w") and breaker.allows("w")  # asking claims nothing
    breaker.failure("w")  # failed again: open for another 5 s
    assert not breaker.allows("w")
    now[0] = 12
    breaker.success("w")
    breaker.failure("w")
    assert breaker.allows("w")  # one failure after a success does not open it


def test_forwarded_for_is_believed_only_from_trusted_proxies() -> None:
    trusted = (ipaddress.ip_network("10.0.0.0/8"),)
    assert client_ip("203.0.113.5", "1.2.3.4", trusted) == "203.0.113.5"
    assert client_ip("10.0.0.1", "1.2.3.4", trusted) == "1.2.3.4"
    assert client_ip("10.0.0.1", "6.6.6.6, 1.2.3.4, 10.0.0.9", trusted) == "1.2.3.4"
    assert client_ip("10.0.0.1", "junk", trusted) == "10.0.0.1"


def test_the_free_tier_knows_an_ipv6_client_by_its_64() -> None:
    """Every address of a /64 is one client (else each would get fresh limits); an
    IPv4-mapped address is its IPv4 address."""
    a, b = free_tier_key("2001:db8:1:2::1"), free_tier_key("2001:db8:1:2:ffff::9")
    assert a == b == "2001:db8:1:2::/64"
    assert free_tier_key("2001:db8:1:3::1") != a
    assert free_tier_key("::ffff:203.0.113.7") == free_tier_key("203.0.113.7") == "203.0.113.7"


def _parse(chat: bool = True, **body: object) -> inbound.Inbound:
    base: dict[str, object] = {"model": "m"}
    base.update({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"})
    base.update(body)
    return inbound.parse(orjson.dumps(base), chat=chat, plan=PLAN)


def test_session_keys() -> None:
    turn1 = _parse(messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "a"}])
    turn2 = _parse(
        messages=[
            {"role": "system", "content": "s"},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ]
    )
    assert turn1.session(None) == turn2.session(None)
    assert turn1.session(None) != _parse().session(None)
    assert _parse(user="u1").session(None) == "u:u1"
    assert _parse(user="u1").session("abc") == "h:abc"


def test_upstream_body_sets_salt_usage_and_max_tokens() -> None:
    req = _parse(stream=True, extra_key="mine", stream_options={"include_usage": False})
    body = orjson.loads(req.upstream_body("salt"))
    assert body["extra_key"] == body["cache_salt"] == "salt"
    # usage on every chunk, whatever the client asked: a cut stream is metered too
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["max_tokens"] == PLAN.max_max_tokens and not req.wants_usage
    assert _parse(max_completion_tokens=7).max_tokens == 7
    # a text completion that names no cap gets OpenAI's 16 tokens, not the plan's most
    assert _parse(chat=False).max_tokens == CompletionRequest.model_fields["max_tokens"].default
    continuous = {"include_usage": True, "continuous_usage_stats": True}
    assert _parse(stream=True, stream_options=continuous).wants_continuous_usage
    assert not _parse(stream=True, stream_options={"continuous_usage_stats": True}).wants_usage


def test_choices_multiply_the_reservation() -> None:
    one = _parse(max_tokens=10)
    assert dataclasses.replace(one, choices=3).cost == one.cost + 20


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 101}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x" * 5000}]}, "messages"),
        ({"stream_options": 3}, "stream_options"),
        # a negative n once made a negative reservation: an unlimited daily quota
        ({"n": -400}, "n"),
        ({"n": 0}, "n"),
        ({"n": "abc"}, "n"),
        ({"n": True}, "n"),
        ({"n": 9}, "n"),  # more choices than the workers serve is refused before admission
        ({"stream": "yes"}, "stream"),
        ({"model": ""}, "model"),
    ],
)
def test_invalid_requests_name_the_parameter(body: dict[str, object], param: str) -> None:
    with pytest.raises(ApiError) as info:
        _parse(**body)
    assert info.value.status == 400 and info.value.param == param


def _sse(data: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def _worker_stream(tokens: int) -> list[bytes]:
    """A worker's stream when asked for usage on every chunk (as the gateway asks)."""

    def usage(k: int) -> dict[str, object]:
        details = {"cached_tokens": 2}
        return {"prompt_tokens": 5, "completion_tokens": k, "prompt_tokens_details": details}

    chunk = {"choices": [{"index": 0, "text": "x", "finish_reason": None}]}
    events = [_sse(chunk | {"usage": usage(k)}) for k in range(1, tokens + 1)]
    return [*events, _sse({"choices": [], "usage": usage(tokens)}), b"data: [DONE]\n\n"]


async def _relay(pieces: list[bytes], wanted: proxy.UsageWanted) -> tuple[list[dict], Outcome]:
    async def rest() -> AsyncIterator[bytes]:
        for piece in pieces[1:]:
            yield piece

    outcome = Outcome(status=200)
    out = b"".join([e async for e in proxy.relay(pieces[0], rest(), wanted, outcome)])
    events = [e[6:] for e in out.split(b"\n\n") if e.startswith(b"data: ")]
    return [orjson.loads(e) for e in events if e != b"[DONE]"], outcome


@pytest.mark.parametrize(
    ("final", "every_chunk"), [(False, False), (True, False), (True, True)], ids=str
)
async def test_a_stream_shows_the_usage_asked_for_and_meters_it_all(
    final: bool, every_chunk: bool
) -> None:
    events, outcome = await _relay(_worker_stream(3), proxy.UsageWanted(final, every_chunk))
    tokens = [e for e in events if e["choices"]]
    assert len(tokens) == 3 and outcome.complete
    if every_chunk:
        assert [e["usage"]["completion_tokens"] for e in tokens] == [1, 2, 3]
    elif final:
        assert all(e["usage"] is None for e in tokens)
    else:
        assert all("usage" not in e for e in tokens)
    assert len(events) - len(tokens) == (1 if final else 0)  # the usage-only chunk
    assert (outcome.prompt_tokens, outcome.cached_tokens, outcome.completion_tokens) == (5, 2, 3)


async def test_a_stream_cut_short_is_metered_with_what_it_delivered() -> None:
    """The worker died after two tokens: the client got them, and so does the usage row."""
    _, outcome = await _relay(_worker_stream(4)[:2], proxy.UsageWanted(False, False))
    assert not outcome.complete and outcome.status == 502
    assert (outcome.prompt_tokens, outcome.completion_tokens) == (5, 2)


async def test_an_error_event_from_the_worker_marks_the_request_failed() -> None:
    error = _sse({"error": {"message": "generation failed", "code": 500}})
    pieces = [_worker_stream(1)[0], error, b"data: [DONE]\n\n"]
    events, outcome = await _relay(pieces, proxy.UsageWanted(False, False))
    assert outcome.complete and outcome.status == 502
    assert events[-1]["error"]["message"] == "generation failed"


def test_a_chat_without_a_cap_fits_what_the_context_leaves() -> None:
    """OpenAI fits an uncapped answer into the context; a long prompt is not a 400 for it."""
    long = [{"role": "user", "content": "x" * 3800}]  # about 950 of the plan's 1000 tokens
    uncapped = _parse(messages=long)
    body = orjson.loads(uncapped.upstream_body("salt"))
    assert body["fit_context"] is True
    assert uncapped.max_tokens == PLAN.max_context - uncapped.prompt_estimate < PLAN.max_max_tokens
    capped = orjson.loads(_parse(max_tokens=5).upstream_body("salt"))
    assert "fit_context" not in capped and capped["max_tokens"] == 5
    with pytest.raises(ApiError):
        _parse(messages=long, max_tokens=PLAN.max_max_tokens)  # a cap it cannot meet is a 400
