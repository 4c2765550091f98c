"""``/v1/responses``: OpenAI's Responses API, served as chat completions.

Creating a response runs the gateway's completion pipeline (:meth:`Gateway.serve`) on the
chat completion the request translates to (:mod:`gateway.responses_request`), so
authentication, admission, rate limits, routing, the KV cache, usage metering and the lease
release on every error are the chat path's own. The worker's answer becomes a response
object (:mod:`gateway.responses_objects`) or its event stream
(:mod:`gateway.responses_stream`), and is stored for its owner
(:mod:`gateway.responses_store`) unless ``store`` is false, for ``GET``, ``DELETE`` and
``previous_response_id``. A response that failed is not stored.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, cast

import asyncpg
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from gateway import responses_request, responses_store, responses_stream
from gateway.auth import Principal
from gateway.call import Call
from gateway.db import UNAVAILABLE
from gateway.errors import ApiError
from gateway.inbound import Inbound
from gateway.responses_objects import Draft
from gateway.responses_request import Message
from gateway.responses_store import ChainError, StoredResponse
from protocol.responses import ResponseCreateRequest

if TYPE_CHECKING:
    # import cycle: the type only; the Gateway makes the ResponsesApi and hands itself in
    from gateway.app import Gateway

log = logging.getLogger(__name__)

#: the path, as metrics label the requests refused before admission
ENDPOINT = "/v1/responses"

_STORE_DOWN = "Cannot read stored responses right now (database unavailable); retry shortly."


class ResponsesApi:
    """The handlers of ``/v1/responses`` for one gateway replica."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    async def create(self, request: Request) -> Response:
        """``POST /v1/responses``."""
        creation = _Creation(self.gw.pool, request)
        return await self.gw.serve(request, ENDPOINT, creation.prepare, creation.respond)

    async def retrieve(self, request: Request) -> Response:
        """``GET /v1/responses/{response_id}``: a stored response of the caller's."""
        who = await self.gw.caller(request)
        if request.query_params.get("stream", "false") != "false":
            raise ApiError(
                400,
                "Replaying a response's events is not supported; GET it without 'stream'.",
                param="stream",
            )
        response_id = request.path_params["response_id"]
        try:
            body = await responses_store.body(self.gw.pool, who.subject, response_id)
        except UNAVAILABLE as exc:
            raise ApiError(503, _STORE_DOWN, headers={"retry-after": "1"}) from exc
        if body is None:
            raise _not_found(response_id)
        return Response(orjson.dumps(body), media_type="application/json")

    async def delete(self, request: Request) -> Response:
        """``DELETE /v1/responses/{response_id}``: forget a stored response of the caller's
        (a later turn can no longer continue a conversation through it)."""
        who = await self.gw.caller(request)
        response_id = request.path_params["response_id"]
        try:
            deleted = await responses_store.delete(self.gw.pool, who.subject, response_id)
        except UNAVAILABLE as exc:
            raise ApiError(503, _STORE_DOWN, headers={"retry-after": "1"}) from exc
        if not deleted:
            raise _not_found(response_id)
        body = {"id": response_id, "object": "response", "deleted": True}
        return Response(orjson.dumps(body), media_type="application/json")


class _Creation:
    """One ``POST /v1/responses`` through the pipeline: what :meth:`prepare` learns before
    admission, :meth:`respond` and :meth:`finish` use after it."""

    def __init__(self, pool: asyncpg.Pool, request: Request) -> None:
        self.pool = pool
        self.request = request
        self.turn: list[Message] = []
        self.who: Principal
        self.draft: Draft

    async def prepare(self, who: Principal) -> Inbound:
        """The chat completion this request is, checked for ``who``'s plan."""
        req = responses_request.read(await self.request.body())
        history = await self._history(who, req)
        self.turn = responses_request.turn(req)
        chat = responses_request.chat_body(req, history, self.turn)
        shaped = responses_request.admit_shape(req, chat, who.plan)
        self.who = who
        self.draft = Draft(
            responses_store.new_id("resp"),
            responses_store.new_id("msg"),
            req,
            req.store,
        )
        return shaped

    async def respond(self, call: Call, response: Response) -> Response:
        """The worker's answer as a response object or its events; refusals pass as they are."""
        draft = self.draft
        if isinstance(response, StreamingResponse):
            chunks = cast(AsyncGenerator[bytes, None], response.body_iterator)
            response.body_iterator = responses_stream.events(chunks, draft, self.finish)
            return response
        if response.status_code != 200:
            return response  # a refusal in OpenAI's error shape
        reply = orjson.loads(response.body)
        choice = reply["choices"][0]
        draft.text = choice["message"].get("content") or ""
        draft.finish_reason = choice.get("finish_reason")
        draft.usage = reply.get("usage")
        await self.finish(draft)
        headers = {
            name: value
            for name, value in response.headers.items()
            if name not in ("content-length", "content-type")
        }
        return Response(
            orjson.dumps(draft.final()),
            200,
            headers,
            media_type="application/json",
            background=response.background,
        )

    async def finish(self, draft: Draft) -> None:
        """The worker's answer is all here: store it (before the client sees it end)."""
        draft.complete()
        await self._store(draft)

    async def _history(self, who: Principal, req: ResponseCreateRequest) -> list[Message]:
        """The stored conversation ``req`` continues (none without ``previous_response_id``)."""
        if req.previous_response_id is None:
            return []
        try:
            return await responses_store.history(self.pool, who.subject, req.previous_response_id)
        except ChainError as exc:
            code = "previous_response_not_found" if exc.status == 404 else None
            raise ApiError(
                exc.status, exc.message, param="previous_response_id", code=code
            ) from None
        except UNAVAILABLE as exc:
            raise ApiError(503, _STORE_DOWN, headers={"retry-after": "1"}) from exc

    async def _store(self, draft: Draft) -> None:
        """Keep a finished response for its owner when asked to; a failed one, or one the
        database cannot take now, is answered with ``store: false``."""
        if not draft.store or draft.status == "failed":
            draft.store = False
            return
        who = self.who
        stored = StoredResponse(
            draft.id,
            who.subject,
            who.team_id,
            draft.request.previous_response_id,
            self.turn,
            draft.text,
            draft.final(),
        )
        retention = responses_store.RETENTION[who.anonymous]
        try:
            await responses_store.save(self.pool, stored, retention)
        except UNAVAILABLE as exc:
            log.warning("response %s not stored (database unavailable): %r", draft.id, exc)
            draft.store = False


def _not_found(response_id: str) -> ApiError:
    return ApiError(
        404,
        f"No response {response_id!r} (it may have expired, been deleted, or been created "
        "with store=false).",
        param="response_id",
        code="not_found",
    )
