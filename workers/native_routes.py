"""SGLang's native ``POST /generate``: text or token ids in, text and ``meta_info`` out.

Clients written against an SGLang server (and the gateway's probes) use this shape. As in
SGLang, each streamed event carries the text generated so far, not just the new piece.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from protocol.disconnect import until_disconnect
from protocol.fields import REQUEST_ID_HEADER
from protocol.openai_requests import MAX_TOKENS_LIMIT, check_seed, parse_body
from protocol.streaming import DONE, sse
from workers.context import WorkerContext, request_id
from workers.generation import TextDelta, collect
from workers.streaming import sse_response, started


class NativeSamplingParams(BaseModel):
    """SGLang's ``sampling_params`` (the subset the built-in engine honours).

    As in SGLang, ``temperature`` has no upper bound here (the engine refuses one that
    overflows float32); token ids are checked against the vocabulary by the worker.
    """

    model_config = ConfigDict(extra="ignore")

    max_new_tokens: int = Field(128, ge=1, le=MAX_TOKENS_LIMIT)
    min_new_tokens: int = Field(0, ge=0, le=MAX_TOKENS_LIMIT)
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    sampling_seed: int | None = None

    @field_validator("sampling_seed")
    @classmethod
    def _seed_fits(cls, seed: int | None) -> int | None:
        return check_seed(seed)

    @property
    def stop_strings(self) -> list[str]:
        """``stop`` as a list."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


class NativeGenerateRequest(BaseModel):
    """The body of ``POST /generate``: exactly one of ``text`` and ``input_ids``."""

    model_config = ConfigDict(extra="ignore")

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: NativeSamplingParams = Field(default_factory=NativeSamplingParams)
    stream: bool = False
    rid: str | None = None
    extra_key: str | None = None
    cache_salt: str | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> NativeGenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("send exactly one of 'text' and 'input_ids'")
        return self


def native_routes(ctx: WorkerContext) -> list[Route]:
    """The routes, bound to ``ctx``."""

    async def generate(request: Request) -> Response:
        body = parse_body(NativeGenerateRequest, await request.body())
        params = body.sampling_params
        rid = body.rid or request_id(request.headers)
        ids = (
            body.input_ids if body.input_ids is not None else ctx.tokenizer.encode(body.text or "")
        )
        gen = ctx.engine_request(
            rid,
            ids,
            max_tokens=params.max_new_tokens,
            sampling={
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": max(params.top_k, 0),
                "seed": params.sampling_seed,
                "min_tokens": params.min_new_tokens,
                "stop_token_ids": tuple(params.stop_token_ids),
                "ignore_eos": params.ignore_eos,
            },
            cache_salt=body.extra_key or body.cache_salt or "",
            param="text" if body.text is not None else "input_ids",
        )
        headers = {REQUEST_ID_HEADER: rid}

        deltas = ctx.start(gen, params.stop_strings)
        if body.stream:
            first_on = await started(request, deltas)
            if first_on is None:  # the client is gone before the first token
                return Response(status_code=499)
            return sse_response(_stream(rid, first_on), headers)
        final = await until_disconnect(request, lambda: collect(deltas))
        if final is None:  # the client is gone; nobody reads this
            return Response(status_code=499)
        return JSONResponse(_result(rid, final.text, final.token_ids, final), headers=headers)

    return [Route("/generate", generate, methods=["POST"])]


def _result(rid: str, text: str, output_ids: list[int], delta: TextDelta) -> dict[str, Any]:
    """SGLang's response object: the text so far and ``meta_info``."""
    usage = delta.usage
    reason = None if delta.finish_reason is None else {"type": delta.finish_reason}
    return {
        "text": text,
        "output_ids": output_ids,
        "meta_info": {
            "id": rid,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cached_tokens": usage.cached_tokens,
            "cached_tokens_by_tier": usage.tiers(),
            "finish_reason": reason,
        },
    }


async def _stream(rid: str, deltas: AsyncIterator[TextDelta]) -> AsyncGenerator[bytes, None]:
    """SSE events with the cumulative text, ending with ``data: [DONE]``."""
    text, ids = "", []
    async with aclosing(deltas):
        async for delta in deltas:
            text += delta.text
            ids.extend(delta.token_ids)
            yield sse(_result(rid, text, list(ids), delta))
    yield DONE
