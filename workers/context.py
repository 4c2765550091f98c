"""What every route of a worker shares: the engine, text tools, config and metrics.

It also holds the request checks that need the model (served name, context length,
vocabulary), so the OpenAI and the native routes apply the same rules. Sampling values are
the engine's to judge (``workers.engine.sampling.check_sampling``): its refusals become
400s here that name the field, as pydantic's do.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Protocol

from tokenizers import Tokenizer as HFTokenizer

from protocol.fields import REQUEST_ID_HEADER
from protocol.openai_requests import RequestError
from workers.engine.api import Engine, GenerateRequest, SamplingParams, TokenEvent
from workers.engine.sampling import SamplingError
from workers.generation import Detokenizer, TextDelta, generate_text
from workers.metrics import ServerMetrics
from workers.tier_metrics import TierStatsSource


class TextTokenizer(Protocol):
    """The tokenizer surface the server needs."""

    vocab_size: int
    #: the ``tokenizers`` pipeline (grammars for structured output are compiled over it)
    backend: HFTokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (markup such as ``<|im_start|>`` parsed); ``add_special_tokens``
        adds the BOS a model wants at the start of a raw prompt."""
        ...

    def detokenizer(self) -> Detokenizer:
        """A fresh incremental detokenizer for one request."""
        ...

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (whole, even part of a character)."""
        ...

    def is_special(self, token_id: int) -> bool:
        """Whether a token is special, which decoded text leaves out."""
        ...


class ChatTemplate(Protocol):
    """Renders chat messages (``{"role", "content", ...}`` dicts) into the prompt text,
    generation prompt included; ``extra`` reaches the template as variables (``tools``)."""

    #: the Jinja source (the format of the model's tool calls is read from it)
    source: str
    #: whether the template renders tool definitions
    takes_tools: bool

    def __call__(self, messages: Sequence[Mapping[str, Any]], **extra: Any) -> str: ...


@dataclass(frozen=True)
class ServerConfig:
    """How the HTTP layer behaves, filled by the composition root."""

    #: Reported verbatim by GET /server_info (e.g. the launch arguments).
    server_info: Mapping[str, Any] = field(default_factory=dict)
    #: Seconds GET /health_generate waits for its one-token generation.
    health_timeout_s: float = 30.0
    #: Snapshot of the KV tier ladder's counters for /metrics (e.g. ``TieredOffload.stats``).
    tier_stats: TierStatsSource | None = None


@dataclass
class WorkerContext:
    """The engine and everything needed to turn HTTP requests into engine requests."""

    engine: Engine
    tokenizer: TextTokenizer
    chat_template: ChatTemplate
    config: ServerConfig
    metrics: ServerMetrics

    def check_model(self, name: str) -> None:
        """Raise a 404 ``model_not_found`` unless ``name`` is the served model id."""
        if name != self.engine.model_id:
            raise RequestError(
                f"the model {name!r} does not exist on this worker; it serves {self.engine.model_id!r}",
                param="model",
                status=404,
                code="model_not_found",
            )

    def engine_request(
        self,
        rid: str,
        input_ids: Sequence[int],
        *,
        max_tokens: int | None,
        sampling: Mapping[str, Any],
        cache_salt: str,
        param: str,
    ) -> GenerateRequest:
        """Check the prompt against the model and build the engine request.

        ``max_tokens`` None means "as many as the context leaves"; ``param`` names the
        request field holding the prompt, for error messages. ``sampling`` holds
        :class:`SamplingParams` fields; token ids among them are checked like the prompt's.
        """
        context = self.engine.context_length
        n = len(input_ids)
        if n == 0:
            raise RequestError("the prompt is empty", param=param)
        self._check_token_ids(input_ids, param)
        self._check_token_ids(sampling.get("stop_token_ids", ()), "stop_token_ids")
        if n >= context:
            raise RequestError(
                f"the prompt is {n} tokens but the model's context is {context} tokens; "
                "shorten the prompt",
                param=param,
            )
        room = context - n
        if max_tokens is None:
            max_tokens = room
        elif max_tokens > room:
            raise RequestError(
                f"max_tokens={max_tokens} plus the {n}-token prompt exceeds the model's "
                f"{context}-token context; ask for at most {room} tokens",
                param="max_tokens",
            )
        if sampling.get("min_tokens", 0) > max_tokens:
            raise RequestError(
                f"min_tokens={sampling['min_tokens']} exceeds max_tokens={max_tokens}",
                param="min_tokens",
            )
        params = SamplingParams(max_tokens=max_tokens, **sampling)
        return GenerateRequest(
            rid=rid, input_ids=tuple(input_ids), sampling=params, cache_salt=cache_salt
        )

    def _check_token_ids(self, ids: Sequence[int], param: str) -> None:
        """Raise a 400 naming ``param`` unless every id is a token of the tokenizer."""
        vocab = self.tokenizer.vocab_size
        if any(not 0 <= i < vocab for i in ids):
            raise RequestError(f"token ids must be in [0, {vocab}) for this model", param=param)

    def start(self, request: GenerateRequest, stops: Sequence[str]) -> AsyncIterator[TextDelta]:
        """Hand ``request`` to the engine; its text deltas (engine refusals become 400s)."""
        try:
            events = self.engine.generate(request)
        except SamplingError as exc:
            raise RequestError(str(exc), param=exc.field) from None
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        detokenizer = self.tokenizer.detokenizer()
        return generate_text(_late_refusals(events), detokenizer, stops, self.metrics)


async def _late_refusals(events: AsyncIterator[TokenEvent]) -> AsyncIterator[TokenEvent]:
    """``events``, with a refusal raised when the stream starts (e.g. a request id already in
    use) turned into a 400 like the refusals ``generate`` raises at once."""
    async with aclosing(events):
        try:
            first = await anext(events)
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        yield first
        async for event in events:
            yield event


def request_id(headers: Mapping[str, str]) -> str:
    """The caller's ``x-request-id``, or a fresh one."""
    return headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
