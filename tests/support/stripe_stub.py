"""A recording stand-in for Stripe's API, plugged in through stripe-python's own seam.

``RecordingStripe`` is an ``stripe.HTTPClient`` subclass (the transport a
``stripe.StripeClient(..., http_client=...)`` uses). It records every request the library
makes and answers with bodies of the shape Stripe documents for the few endpoints kvgate
calls. It keeps the two Stripe behaviours billing correctness depends on: a repeated
``Idempotency-Key`` replays the first answer, and meter events are counted once per
``identifier``; event summaries are computed from the events it accepted, grouped by the
hour or day of their timestamps as Stripe groups them. It refuses, as Stripe does, a meter
event stamped more than 35 days back or more than 5 minutes ahead (an answer that fails
validation is not saved for its idempotency key). ``fail_next`` makes the next calls to a
path answer 5xx (after which stripe-python retries).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import stripe

#: Stripe's limits on a meter event's timestamp: 35 calendar days back, 5 minutes ahead.
_MAX_EVENT_AGE_S = 35 * 86400
_MAX_EVENT_LEAD_S = 300
#: ``value_grouping_window`` -> seconds per summary.
_WINDOWS = {"hour": 3600, "day": 86400}


@dataclass
class Recorded:
    """One request as stripe-python sent it."""

    method: str
    path: str
    params: dict[str, str]
    headers: dict[str, str]
    status: int = 200


@dataclass
class MeterEvent:
    event_name: str
    identifier: str
    customer: str
    value: int
    timestamp: int


@dataclass
class RecordingStripe(stripe.HTTPClient):
    """Stripe's API as far as kvgate uses it; see the module docstring."""

    #: Stripe meter id -> the event name it aggregates.
    meters: dict[str, str] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    events: dict[str, MeterEvent] = field(default_factory=dict)
    fail_next: Counter[str] = field(default_factory=Counter)
    _replies: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    _ids: int = 0
    #: Stripe's ids are unique across an account; tests share one database, so each stub
    #: draws its ids from its own series rather than restarting at 000001.
    _series: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def __post_init__(self) -> None:
        super().__init__()

    name = "recording-stub"

    # --- the HTTPClient interface ---------------------------------------------------------
    async def request_async(
        self, method: str, url: str, headers: Any, post_data: Any = None
    ) -> tuple[bytes, int, dict[str, str]]:
        parts = urlsplit(url)
        raw = post_data if method.lower() == "post" else parts.query
        if isinstance(raw, bytes):
            raw = raw.decode()
        params = dict(parse_qsl(raw or "", keep_blank_values=True))
        rec = Recorded(method.lower(), parts.path, params, dict(headers))
        self.requests.append(rec)
        if self.fail_next[parts.path] > 0:
            self.fail_next[parts.path] -= 1
            rec.status = 500
            body = {"error": {"type": "api_error", "message": "simulated Stripe outage"}}
            return json.dumps(body).encode(), 500, {"request-id": "req_fail"}
        key = rec.headers.get("Idempotency-Key")
        if key and key in self._replies:
            content, status = self._replies[key]
            return content, status, {"idempotent-replayed": "true", "request-id": "req_replay"}
        status, body = self._answer(rec)
        content = json.dumps(body).encode()
        if key and status < 400:
            self._replies[key] = (content, status)
        rec.status = status
        return content, status, {"request-id": f"req_{len(self.requests)}"}

    def sleep_async(self, secs: float) -> Any:
        # stripe-python's backoff between retries: not waited out in tests.
        return asyncio.sleep(0)

    async def close_async(self) -> None:
        return None

    def request(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("kvgate uses the async Stripe API only")

    def close(self) -> None:
        return None

    # --- recorded-shape answers ---------------------------------------------------------------
    def _id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}_test_{self._series}{self._ids:06d}"

    def _answer(self, rec: Recorded) -> tuple[int, dict[str, Any]]:
        p = rec.params
        now = int(time.time())
        if rec.path == "/v1/customers" and rec.method == "post":
            return 200, {
                "id": self._id("cus"),
                "object": "customer",
                "created": now,
                "email": p.get("email"),
                "name": p.get("name"),
                "metadata": {"team_id": p.get("metadata[team_id]")},
                "livemode": False,
            }
        if rec.path == "/v1/checkout/sessions" and rec.method == "post":
            sid = self._id("cs")
            return 200, {
                "id": sid,
                "object": "checkout.session",
                "mode": "subscription",
                "customer": p.get("customer"),
                "client_reference_id": p.get("client_reference_id"),
                "status": "open",
                "url": f"https://checkout.stripe.com/c/pay/{sid}",
                "livemode": False,
            }
        if rec.path == "/v1/billing_portal/sessions" and rec.method == "post":
            sid = self._id("bps")
            return 200, {
                "id": sid,
                "object": "billing_portal.session",
                "customer": p.get("customer"),
                "return_url": p.get("return_url"),
                "url": f"https://billing.stripe.com/p/session/{sid}",
                "livemode": False,
            }
        if rec.path == "/v1/billing/meter_events" and rec.method == "post":
            stamp = int(p["timestamp"])
            if not now - _MAX_EVENT_AGE_S <= stamp <= now + _MAX_EVENT_LEAD_S:
                return 400, {
                    "error": {
                        "type": "invalid_request_error",
                        "param": "timestamp",
                        "message": "Meter event timestamps must be within the past 35 calendar "
                        "days and no more than 5 minutes in the future.",
                    }
                }
            event = MeterEvent(
                p["event_name"],
                p["identifier"],
                p["payload[stripe_customer_id]"],
                int(p["payload[value]"]),
                int(p["timestamp"]),
            )
            self.events.setdefault(event.identifier, event)  # Stripe: once per identifier
            return 200, {
                "object": "billing.meter_event",
                "created": now,
                "event_name": event.event_name,
                "identifier": event.identifier,
                "livemode": False,
                "payload": {"stripe_customer_id": event.customer, "value": str(event.value)},
                "timestamp": event.timestamp,
            }
        if rec.path.startswith("/v1/billing/meters/") and rec.path.endswith("/event_summaries"):
            return self._summaries(rec.path.split("/")[4], p)
        return 404, {"error": {"type": "invalid_request_error", "message": f"no {rec.path}"}}

    def _summaries(self, meter_id: str, p: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """Totals per window of ``value_grouping_window`` (one for the whole range without).

        As Stripe does, an hourly grouping needs hour-aligned bounds and a daily one UTC
        midnights; windows without events are left out.
        """
        start, end = int(p["start_time"]), int(p["end_time"])
        window = _WINDOWS.get(p.get("value_grouping_window", ""), end - start)
        if window <= 0 or start % window or end % window:
            return 400, {
                "error": {
                    "type": "invalid_request_error",
                    "message": f"start_time and end_time must align with the {window}s window",
                }
            }
        windows: Counter[int] = Counter()
        for e in self.events.values():
            if (
                e.event_name == self.meters.get(meter_id)
                and e.customer == p["customer"]
                and start <= e.timestamp < end
            ):
                windows[e.timestamp - (e.timestamp - start) % window] += e.value
        data = [
            {
                "id": f"mtrsum_{meter_id}_{at}",
                "object": "billing.meter_event_summary",
                "aggregated_value": float(value),
                "start_time": at,
                "end_time": at + window,
                "livemode": False,
                "meter": meter_id,
            }
            for at, value in sorted(windows.items())
        ]
        return 200, self._page(data, p, f"/v1/billing/meters/{meter_id}/event_summaries")

    def _page(self, data: list[dict[str, Any]], p: dict[str, str], url: str) -> dict[str, Any]:
        """One page of ``data`` as Stripe's list endpoints cut it (``limit``, ``starting_after``)."""
        limit = int(p.get("limit", "10"))
        after = p.get("starting_after")
        ids = [d["id"] for d in data]
        first = ids.index(after) + 1 if after in ids else 0
        page = data[first : first + limit]
        return {"object": "list", "data": page, "has_more": first + limit < len(data), "url": url}

    # --- helpers for assertions -----------------------------------------------------------
    def calls(self, path: str) -> list[Recorded]:
        """Requests made to ``path``, in order."""
        return [r for r in self.requests if r.path == path]
