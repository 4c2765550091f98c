"""A recording stand-in for Stripe's API, plugged in through stripe-python's own seam.

``RecordingStripe`` is an ``stripe.HTTPClient`` subclass (the transport a
``stripe.StripeClient(..., http_client=...)`` uses). It records every request the library
makes and answers with bodies of the shape Stripe documents for the few endpoints kvgate
calls. It keeps the two Stripe behaviours billing correctness depends on: a repeated
``Idempotency-Key`` replays the first answer, and meter events are counted once per
``identifier``; event summaries are computed from the events it accepted. ``fail_next``
makes the next calls to a path answer 5xx (after which stripe-python retries).
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
        if key:
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
            return 200, self._summaries(rec.path.split("/")[4], p)
        return 404, {"error": {"type": "invalid_request_error", "message": f"no {rec.path}"}}

    def _summaries(self, meter_id: str, p: dict[str, str]) -> dict[str, Any]:
        start, end = int(p["start_time"]), int(p["end_time"])
        days: Counter[int] = Counter()
        for e in self.events.values():
            if (
                e.event_name == self.meters.get(meter_id)
                and e.customer == p["customer"]
                and start <= e.timestamp < end
            ):
                days[e.timestamp - (e.timestamp - start) % 86400] += e.value
        data = [
            {
                "id": f"mtrsum_{meter_id}_{day}",
                "object": "billing.meter_event_summary",
                "aggregated_value": float(value),
                "start_time": day,
                "end_time": day + 86400,
                "livemode": False,
                "meter": meter_id,
            }
            for day, value in sorted(days.items())
        ]
        return {"object": "list", "data": data, "has_more": False, "url": "/v1/billing/meters"}

    # --- helpers for assertions -----------------------------------------------------------
    def calls(self, path: str) -> list[Recorded]:
        """Requests made to ``path``, in order."""
        return [r for r in self.requests if r.path == path]
