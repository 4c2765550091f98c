"""Pure parts of the gateway: routing bounds, circuit breaker, client IP, request parsing."""

from __future__ import annotations

import ipaddress

import orjson
import pytest

from gateway import inbound
from gateway.accounts import Plan
from gateway.breaker import Breaker
from gateway.client_ip import client_ip
from gateway.errors import ApiError
from gateway.router import Router, bound
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
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == PLAN.max_max_tokens and not req.wants_usage
    assert _parse(max_completion_tokens=7).max_tokens == 7


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 101}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x" * 5000}]}, "messages"),
        ({"stream_options": 3}, "stream_options"),
    ],
)
def test_invalid_requests_name_the_parameter(body: dict[str, object], param: str) -> None:
    with pytest.raises(ApiError) as info:
        _parse(**body)
    assert info.value.status == 400 and info.value.param == param
