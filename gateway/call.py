"""One admitted request's way through the gateway: routing, proxying, metering.

:class:`Call` picks a worker (retrying others while nothing has reached the client),
answers whole or relays the stream, and when the answer is done releases the admission
lease and records the usage row and metrics, whatever became of the request. A successful
answer's row is committed to Postgres before the answer's end is sent.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import anyio
import orjson
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response

from gateway import inbound, proxy
from gateway.admission import Decision
from gateway.auth import Principal
from gateway.errors import ApiError
from gateway.usage import UsageRow, tier_counts
from protocol.disconnect import until_disconnect
from protocol.fields import REQUEST_ID_HEADER, SESSION_HEADER
from protocol.registry import WorkerInfo
from protocol.streaming import HangupAwareStream

if TYPE_CHECKING:
    # import cycle: the type only; the Gateway makes each Call and hands itself in
    from gateway.app import Gateway

#: the worker path of each kind of completion (chat or not)
PATHS = {True: "/v1/chat/completions", False: "/v1/completions"}


class Call:
    """One admitted request on its way through routing, proxying and metering."""

    def __init__(
        self,
        gw: Gateway,
        who: Principal,
        req: inbound.Inbound,
        decision: Decision,
        request_id: str,
        started: float,
        endpoint: str,
    ) -> None:
        self.gw = gw
        #: the gateway route the client called, the label of its request metrics
        self.endpoint = endpoint
        self.who = who
        self.req = req
        self.decision = decision
        self.request_id = request_id
        self.started = started
        self.outcome = proxy.Outcome()
        self.worker = ""
        self.upstream_s = 0.0
        self._finished = False
        self._recorded = False

    async def forward(self, request: Request, headers: dict[str, str]) -> Response:
        """Route, proxy (retrying other workers before the first byte) and respond.

        A non-streamed request whose client leaves is cancelled at once, which cuts the
        worker's connection and so ends its generation; its usage row says 499.
        """
        gw, cfg = self.gw, self.gw.config
        session = self.req.session(request.headers.get(SESSION_HEADER))
        body = self.req.upstream_body(self.who.cache_salt)
        upstream_headers = {"content-type": "application/json", REQUEST_ID_HEADER: self.request_id}
        tried: set[str] = set()
        path = PATHS[self.req.chat]
        for _ in range(cfg.max_attempts):
            worker = gw.router.choose(
                self.req.model, session, lambda w: w not in tried and gw.breaker.allows(w)
            )
            if worker is None:
                break
            tried.add(worker.worker_id)
            gw.router.acquire(worker.worker_id)
            sent = time.perf_counter()
            try:
                if self.req.stream:
                    answer = await gw.upstream.open_stream(
                        worker.url + path, body, upstream_headers
                    )
                else:
                    fetch = functools.partial(
                        gw.upstream.fetch, worker.url + path, body, upstream_headers
                    )
                    fetched = await until_disconnect(request, fetch)
                    if fetched is None:
                        gw.router.release(worker.worker_id)
                        self.worker = worker.worker_id
                        return self.finish_error(None)
                    answer = fetched
            except proxy.UpstreamUnavailable as exc:
                gw.router.release(worker.worker_id)
                gw.breaker.failure(worker.worker_id)
                gw.metrics.upstream_errors.labels(worker.worker_id, exc.kind).inc()
                continue
            except proxy.UpstreamTimeout:
                gw.router.release(worker.worker_id)
                self.worker = worker.worker_id
                gw.metrics.upstream_errors.labels(worker.worker_id, "timeout").inc()
                return self.finish_error(
                    ApiError(
                        504,
                        f"The worker sent no answer within {cfg.upstream_timeout_s:g} s; ask "
                        "for fewer max_tokens, or stream the response.",
                        code="upstream_timeout",
                        headers=headers,
                    )
                )
            gw.breaker.success(worker.worker_id)
            self.worker = worker.worker_id
            self.upstream_s = time.perf_counter() - sent
            if isinstance(answer, proxy.Stream):
                return self._stream(worker, answer, headers)
            gw.router.release(worker.worker_id)
            response = self._plain(answer, headers)
            if self.outcome.status == 200:
                await self._commit_usage()
            return response
        return self.finish_error(
            ApiError(
                503,
                f"No worker could take this request for model {self.req.model!r} "
                f"(tried {len(tried)}); retry shortly.",
                code="no_worker_available",
                headers={**headers, "retry-after": "1"},
            )
        )

    def _plain(self, reply: proxy.Reply, headers: dict[str, str]) -> Response:
        """A whole answer (non-streaming, or a worker's refusal of a stream) passed on."""
        self.outcome.status = reply.status
        if reply.status == 200 and not self.req.stream:
            with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
                self.outcome.take_usage(orjson.loads(reply.body).get("usage"))
        self.gw.metrics.added.observe(time.perf_counter() - self.started - self.upstream_s)
        return Response(
            reply.body,
            reply.status,
            headers,
            media_type=reply.content_type,
            background=BackgroundTask(self._finish),
        )

    def _stream(
        self, worker: WorkerInfo, stream: proxy.Stream, headers: dict[str, str]
    ) -> Response:
        self.outcome.status = 200
        self.gw.metrics.added.observe(time.perf_counter() - self.started - self.upstream_s)
        chunks, first = stream.chunks, stream.first

        async def body() -> AsyncIterator[bytes]:
            try:
                usage = proxy.UsageWanted(self.req.wants_usage, self.req.wants_continuous_usage)
                async for piece in proxy.relay(first, chunks, usage, self.outcome):
                    if self.outcome.complete and self.outcome.status == 200:
                        await self._commit_usage()  # before the client sees [DONE]
                    yield piece
                if self.outcome.status == 502:
                    self.gw.metrics.upstream_errors.labels(worker.worker_id, "midstream").inc()
            except BaseException:
                if not self.outcome.complete:
                    self.outcome.status = 499  # the client went away: abort upstream below
                raise
            finally:
                # Shielded: a hang-up cancels this task, and the lease and usage row must
                # still be written.
                with anyio.CancelScope(shield=True):
                    stream.close(complete=self.outcome.complete)
                    self.gw.router.release(worker.worker_id)
                    await self._finish()

        return HangupAwareStream(body(), 200, headers, media_type="text/event-stream")

    def finish_error(self, error: ApiError | None) -> Response:
        """Answer with ``error``, metered like any other request; None is a client that
        left (499, and nobody reads the answer)."""
        if error is None:
            self.outcome.status = 499
            return Response(status_code=499, background=BackgroundTask(self._finish))
        self.outcome.status = error.status
        return Response(
            error.response().body,
            error.status,
            error.headers,
            media_type="application/json",
            background=BackgroundTask(self._finish),
        )

    async def _commit_usage(self) -> None:
        """Write the usage row of a successful answer before its end goes out, so that
        a replica dying right after cannot lose it (``UsageRecorder.commit``)."""
        if not self._recorded:
            self._recorded = True
            await self.gw.usage.commit(self._usage_row())

    def _usage_row(self) -> UsageRow:
        out, who = self.outcome, self.who
        ttft = None if out.first_token_at is None else (out.first_token_at - self.started)
        return UsageRow(
            request_id=self.request_id,
            ts=datetime.now(UTC),
            team_id=who.team_id,
            key_id=who.key_id,
            client_ip=who.client_ip if who.anonymous else None,
            subject=who.subject,
            model=self.req.model,
            worker=self.worker,
            prompt_tokens=out.prompt_tokens,
            cached_tokens=out.cached_tokens,
            completion_tokens=out.completion_tokens,
            reserved_tokens=self.req.cost if self.decision.reserved_daily else 0,
            ttft_ms=None if ttft is None else ttft * 1000,
            latency_ms=(time.perf_counter() - self.started) * 1000,
            status=out.status,
            **tier_counts(out.cached_by_tier),
        )

    async def _finish(self) -> None:
        """Release the admission lease and record usage and metrics, once per request."""
        if self._finished:
            return
        self._finished = True
        gw, out, who = self.gw, self.outcome, self.who
        now = time.perf_counter()
        ttft = None if out.first_token_at is None else (out.first_token_at - self.started)
        if not self._recorded:
            self._recorded = True
            gw.usage.record(self._usage_row())
        gw.metrics.requests.labels(self.endpoint, str(out.status), who.plan.name).inc()
        gw.metrics.latency.labels(self.endpoint).observe(now - self.started)
        if ttft is not None:
            gw.metrics.ttft.observe(ttft)
        gw.metrics.count_tokens(
            out.prompt_tokens, out.cached_tokens, out.completion_tokens, out.cached_by_tier
        )
        gw.limiter.release(self.decision.lease)
