"""How ``kvgate bench faults`` judges a phase: which failures a kill excuses, what counts
as a wrong output or a lost usage row, and when the fault counts as recovered from."""

from __future__ import annotations

from kvgate.bench.faults.load import Request
from kvgate.bench.faults.matrix import FAULTS
from kvgate.bench.faults.report import Phase, UsageRow, judge

GATEWAY_KILL = next(f for f in FAULTS if f.name == "gateway_kill")
REFERENCE = {("c0", 0): "alpha", ("c0", 1): "beta"}
KILLED, OTHER = "http://127.0.0.1:1", "http://127.0.0.1:2"


def _req(
    rid: str, start: float, end: float, gateway: str, outcome: str, text: str = "alpha"
) -> Request:
    return Request(
        "gateway_kill", "c0", 0, start, gateway=gateway, end=end, outcome=outcome,
        request_id=rid, text=text, prompt_tokens=10, completion_tokens=2,
    )  # fmt: skip


def _row() -> UsageRow:
    return UsageRow("fault-a", 200, 10, 2)


def _phase() -> Phase:
    return Phase(GATEWAY_KILL, start=0.0, injected=10.0, ended=10.0, killed_gateway=KILLED)


def test_only_requests_in_flight_on_the_killed_replica_may_fail() -> None:
    requests = [
        _req("a", 9.0, 10.5, KILLED, "cut"),  # in flight on the killed replica: excused
        _req("b", 9.0, 10.5, OTHER, "cut"),  # on the other replica: not excused
        _req("c", 10.2, 11.0, OTHER, "ok"),
    ]
    phase = _phase()
    figures = judge(phase, requests, REFERENCE, {"c": _row()}, [phase])
    assert figures["failed"] == 2
    assert figures["failed_in_flight_on_killed"] == 1
    assert figures["unexpected_failures"] == 1
    assert figures["recover_s"] == 1.0
    assert not figures["met"]


def test_a_different_answer_and_a_missing_usage_row_fail_the_phase() -> None:
    requests = [
        _req("a", 10.5, 11.0, OTHER, "ok", text="gamma"),  # the reference says alpha
        _req("b", 10.5, 11.5, OTHER, "ok"),  # no usage row
        _req("c", 10.5, 12.0, KILLED, "ok"),
    ]
    phase = _phase()
    figures = judge(phase, requests, REFERENCE, {"a": _row(), "c": _row()}, [phase])
    assert (figures["wrong_outputs"], figures["usage_lost"]) == (1, 1)
    assert figures["back_s"] == 2.0  # the restarted replica's first success
    assert not figures["met"]


def test_a_phase_with_nothing_lost_and_a_quick_recovery_meets_the_targets() -> None:
    requests = [_req("a", 9.0, 10.5, KILLED, "cut"), _req("b", 10.1, 10.6, OTHER, "ok")]
    phase = _phase()
    figures = judge(phase, requests, REFERENCE, {"b": _row()}, [phase])
    assert figures["met"]
    assert figures["hung_requests"] == 0


def test_a_request_sent_while_the_replica_was_dying_is_excused_one_after_is_not() -> None:
    phase = _phase()
    phase.notes = {"died_after_s": 0.1}  # the process was gone 0.1 s after the signal
    requests = [
        _req("a", 10.02, 10.1, KILLED, "cut"),  # sent on a socket the dying replica held
        _req("b", 10.3, 10.4, KILLED, "cut"),  # sent after it was gone: should be refused
        _req("c", 10.5, 11.0, OTHER, "ok"),
    ]
    figures = judge(phase, requests, REFERENCE, {"c": _row()}, [phase])
    assert (figures["failed_in_flight_on_killed"], figures["unexpected_failures"]) == (1, 1)


def test_a_request_of_one_phase_cut_by_the_next_phase_s_kill_is_excused() -> None:
    """A slow request started under one fault and cut when the next phase killed a replica."""
    tierd = next(f for f in FAULTS if f.name == "tierd_kill")
    earlier = Phase(tierd, start=0.0, injected=5.0, ended=5.0)
    kill = _phase()  # the gateway kill at 10.0
    slow = Request("tierd_kill", "c0", 0, 6.0, gateway=KILLED, end=10.05, outcome="cut")
    figures = judge(earlier, [slow], REFERENCE, {}, [kill])
    assert (figures["failed_in_flight_on_killed"], figures["unexpected_failures"]) == (1, 0)
