"""Request bodies of the OpenAI-compatible endpoints, validated before anything runs.

Both the gateway (which inspects and rewrites bodies before proxying) and the workers
(which serve them) validate requests with these models (:func:`validate`), so a body the
gateway accepts is a body a worker accepts. Beyond OpenAI's parameters they carry SGLang's sampling extras
(``min_tokens``, ``top_k``, ``stop_token_ids``, ``ignore_eos``) and the cache-salt fields
of :mod:`protocol.fields`. Unknown fields are ignored, as OpenAI-compatible servers do;
parameters we cannot honour (``echo``, ``suffix``) are rejected rather than ignored so
that a client never silently gets less than it asked for. Checks that need the model (token
ids against its vocabulary, lengths against its context) are the worker's, which also
samples a temperature below 1e-5 greedily and reads a ``top_k`` beyond the vocabulary as
"keep every token".
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from protocol.structured import ResponseFormat, ToolCallItem, ToolRequest

#: Upper bound on any token count a client may ask for; anything above is a typo or abuse.
#: The real limit (the model's context) is checked by the server once the prompt is known.
MAX_TOKENS_LIMIT = 1_000_000

#: Deepest nesting of arrays and objects a request body may have. Real bodies nest a few
#: levels (messages, content parts, a JSON schema); hundreds of levels only exhaust the
#: recursion of whatever walks the body later, so they are refused as they are read.
MAX_DEPTH = 64

#: Most choices one request may ask for: each is a sequence the engine decodes, and the
#: gateway reserves every one's tokens at admission.
MAX_CHOICES = 8

#: Most alternatives per token a chat completion may ask for (``top_logprobs``), and a text
#: completion (``logprobs``), as OpenAI allows.
MAX_TOP_LOGPROBS = 20
MAX_TEXT_LOGPROBS = 5

#: The seeds a request may carry: any signed or unsigned 64-bit integer (what a
#: ``torch.Generator`` takes; larger ones would fail inside the worker's engine).
SEED_RANGE = (-(2**63), 2**64 - 1)

#: Roles a chat message may have.
Role = Literal["system", "developer", "user", "assistant", "tool"]


class RequestError(ValueError):
    """A request body that cannot be served; ``message`` says what to change."""

    def __init__(
        self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code


class ChatMessage(BaseModel):
    """One turn of a conversation."""

    model_config = ConfigDict(extra="ignore")

    role: Role
    content: str | None = None
    name: str | None = None
    #: an assistant turn's calls
    tool_calls: list[ToolCallItem] | None = None
    #: a tool turn's answer is to this call
    tool_call_id: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _join_text_parts(cls, content: Any) -> Any:
        # OpenAI also allows a list of typed parts; we serve text only, so join the parts.
        if not isinstance(content, list):
            return content
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ValueError(
                    "only text content parts ({'type': 'text', 'text': ...}) are supported"
                )
            if not isinstance(part.get("text"), str):
                raise ValueError("a text content part needs a string 'text'")
            texts.append(part["text"])
        return "".join(texts)

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        # Only an assistant turn (e.g. one that made tool calls) may come without content.
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role!r} message needs 'content'")
        return self


class StreamOptions(BaseModel):
    """``stream_options``: the usage chunk at the end, and (an SGLang and vLLM extension)
    the running usage on every chunk."""

    model_config = ConfigDict(extra="ignore")

    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


TokenCount = Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS_LIMIT)]


class _SamplingRequest(BaseModel):
    """Parameters shared by chat and text completions."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    max_tokens: TokenCount | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    #: choices for the one prompt (the prompt is computed and billed once)
    n: StrictInt = Field(1, ge=1, le=MAX_CHOICES)
    user: str | None = None
    # SGLang extras
    min_tokens: int = Field(0, ge=0, le=MAX_TOKENS_LIMIT)
    top_k: int = Field(0, ge=-1)  # 0 and -1 (SGLang's spelling) both mean "off"
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: StrictBool = False
    extra_key: str | None = None
    cache_salt: str | None = None
    #: JSON, or JSON following a schema (the built-in worker constrains decoding to it)
    response_format: ResponseFormat | None = None
    #: kvgate's: ``max_tokens`` is a cap, and the answer may use what the context leaves
    #: below it (what OpenAI does when no max_tokens is given; the gateway sets it then,
    #: with the plan's cap)
    fit_context: StrictBool = False

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop: str | list[str] | None) -> str | list[str] | None:
        values = [stop] if isinstance(stop, str) else (stop or [])
        if any(not s for s in values):
            raise ValueError("stop strings must be non-empty")
        if len(values) > 16:
            raise ValueError("at most 16 stop strings are supported")
        return stop

    @field_validator("stop_token_ids")
    @classmethod
    def _token_ids(cls, ids: list[int]) -> list[int]:
        if any(i < 0 for i in ids):
            raise ValueError("token ids must be >= 0")
        return ids

    @field_validator("seed")
    @classmethod
    def _seed_fits(cls, seed: int | None) -> int | None:
        return check_seed(seed)

    @property
    def stop_strings(self) -> list[str]:
        """``stop`` as a list."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def salt(self) -> str:
        """The tenant's cache salt (``extra_key`` wins, as in SGLang)."""
        return self.extra_key or self.cache_salt or ""

    @property
    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Whether every chunk of a streamed response carries the usage so far (only
        with ``include_usage``, as in vLLM)."""
        options = self.stream_options
        return options is not None and options.include_usage and options.continuous_usage_stats

    def requested_max_tokens(self) -> int | None:
        """The completion-length cap the client asked for, or None for "up to the context"."""
        return self.max_tokens


class ChatCompletionRequest(_SamplingRequest, ToolRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: TokenCount | None = None
    #: the log-probability of each generated token (``choices[i].logprobs.content``)
    logprobs: StrictBool | None = None
    #: with ``logprobs``, the most likely alternatives at each position, this many
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, top: int | None, info: ValidationInfo) -> int | None:
        if top is not None and info.data.get("logprobs") is not True:
            raise ValueError("only taken with 'logprobs': true; send that too, or remove it")
        return top

    @property
    def logprobs_k(self) -> int | None:
        """Alternatives per token to report, or None when no log-probabilities are asked."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` (the current OpenAI name) wins over ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_SamplingRequest):
    """``POST /v1/completions`` (one prompt: a string or a list of token ids)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: TokenCount | None = 16  # OpenAI's default for text completions
    #: the log-probability of each generated token and of this many alternatives
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TEXT_LOGPROBS)
    echo: StrictBool = False
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, prompt: Any) -> str | list[int]:
        # A batch of one is the same request as its single prompt.
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise ValueError(
                    "only one prompt per request is supported; send a batch as separate requests"
                )
            prompt = prompt[0]
        if isinstance(prompt, list) and any(i < 0 for i in prompt):
            raise ValueError("token ids must be >= 0")
        if not prompt:
            raise ValueError("the prompt is empty")
        return prompt

    @property
    def logprobs_k(self) -> int | None:
        """Alternatives per token to report, or None when no log-probabilities are asked."""
        return self.logprobs

    @model_validator(mode="after")
    def _unsupported(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported by this server; remove 'echo'")
        if self.suffix:
            raise ValueError("suffix is not supported by this server; remove 'suffix'")
        return self


def check_seed(seed: int | None) -> int | None:
    """``seed`` unchanged when it lies in :data:`SEED_RANGE`, else a ValueError saying so."""
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise ValueError(
            f"seed {seed} does not fit in 64 bits; send an integer in "
            f"[{SEED_RANGE[0]}, {SEED_RANGE[1]}]"
        )
    return seed


M = TypeVar("M", bound=BaseModel)


def parse_body(model: type[M], body: bytes) -> M:
    """Parse a JSON request body into ``model``; :class:`RequestError` says what is wrong."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestError(f"the request body nests deeper than {MAX_DEPTH} levels") from None
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object")
    check_depth(data)
    return validate(model, data)


def check_depth(data: Any, limit: int = MAX_DEPTH) -> None:
    """:class:`RequestError` when ``data`` nests arrays and objects deeper than ``limit``.

    Iterative, so that the check itself cannot run out of stack."""
    level: list[Any] = [data]
    for _ in range(limit):
        level = [
            child
            for value in level
            for child in (value.values() if isinstance(value, dict) else value)
            if isinstance(child, dict | list)
        ]
        if not level:
            return
    raise RequestError(f"the request body nests deeper than {limit} levels")


def validate(model: type[M], data: dict[str, Any]) -> M:
    """``data`` (a parsed JSON object) as ``model``; :class:`RequestError` says what is wrong.

    Booleans must be JSON booleans: ``"yes"`` or ``1`` for ``stream`` is a mistake to
    report, not a value to guess at.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _request_error(exc) from None


def _request_error(exc: ValidationError) -> RequestError:
    """Turn pydantic's first complaint into one readable sentence naming the field."""
    error = exc.errors(include_url=False)[0]
    # Drop pydantic's union-branch names (``str``, ``list[...]``) from the location.
    loc = [str(p) for p in error["loc"] if not _is_type_tag(p)]
    param = ".".join(loc) or None
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "missing":
        message = "this field is required"
    elif error["type"] == "literal_error" and loc and loc[-1] == "role":
        message = f"unknown role {error.get('input')!r}; {message[0].lower()}{message[1:]}"
    return RequestError(f"{param}: {message}" if param else message, param=param)


def _is_type_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in {"str", "int", "none"} or "[" in part)
