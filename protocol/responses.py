"""The request body of OpenAI's Responses API (``POST /v1/responses``), validated before
anything runs.

The gateway serves a Responses request as a chat completion, so this model accepts what a
chat completion can honour: text input (a string, or messages whose content is text
parts), ``instructions``, sampling and a length cap, streaming, storage and chaining by
``previous_response_id``, and ``text.format`` (which becomes the chat's
``response_format``). What would need more — tools, images, files, audio, reasoning
options, background runs, server-side conversations, prompt templates — is refused with a
400 naming the field, never silently ignored. Unknown fields are ignored, as elsewhere.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from protocol.openai_requests import RequestError, TokenCount, check_depth, validate

#: OpenAI's bounds on ``metadata``: pairs, key length, value length.
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512

#: Content parts the input may carry: text, whether the client wrote it or copied it from
#: an earlier response's output.
TEXT_PARTS = ("input_text", "output_text")

#: Fields that ask for what a chat completion cannot do, and what to do instead. Any value
#: but absent, null, false or empty is refused.
UNSUPPORTED = {
    "tools": "tools are not supported on /v1/responses; remove 'tools'",
    "background": "background responses are not supported; remove 'background'",
    "conversation": (
        "server-side conversations are not supported; chain turns with "
        "'previous_response_id' instead"
    ),
    "prompt": "prompt templates are not supported; send the text as 'input'",
    "reasoning": "reasoning options are not supported by these models; remove 'reasoning'",
    "include": "'include' is not supported; remove it",
    "top_logprobs": "logprobs are not supported on /v1/responses; remove 'top_logprobs'",
    "max_tool_calls": "tools are not supported on /v1/responses; remove 'max_tool_calls'",
}

#: ``tool_choice`` values that ask for no tool (there are none to choose from).
NO_TOOL_CHOICES = ("none", "auto")


class TextPart(BaseModel):
    """A text content part (``input_text``, or ``output_text`` from an earlier output)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["input_text", "output_text"]
    text: str


class InputMessage(BaseModel):
    """One message of ``input`` (OpenAI's easy input message, or a message item)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        if isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in TEXT_PARTS:
                    raise ValueError(
                        f"content parts of type {kind!r} are not supported; send text "
                        "parts ({'type': 'input_text', 'text': ...})"
                    )
                if not isinstance(part.get("text"), str):
                    raise ValueError("a text part needs a string 'text'")
        return content

    @property
    def text(self) -> str:
        """The message's text, parts joined."""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class TextFormat(BaseModel):
    """``text.format``: plain text, any JSON object, or JSON matching a schema."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: StrictBool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> TextFormat:
        if self.type == "json_schema" and (self.json_schema is None or not self.name):
            raise ValueError("a 'json_schema' format needs a 'name' and a 'schema'")
        return self

    def response_format(self) -> dict[str, Any] | None:
        """The chat completion's ``response_format`` for this format (None for text)."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "json_object"}
        spec: dict[str, Any] = {"name": self.name, "schema": self.json_schema}
        if self.description is not None:
            spec["description"] = self.description
        if self.strict is not None:
            spec["strict"] = self.strict
        return {"type": "json_schema", "json_schema": spec}


class TextConfig(BaseModel):
    """``text``: the output's format."""

    model_config = ConfigDict(extra="ignore")

    format: TextFormat | None = None


class ResponseCreateRequest(BaseModel):
    """``POST /v1/responses``."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    input: str | list[InputMessage]
    instructions: str | None = None
    max_output_tokens: TokenCount | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: StrictBool = False
    #: an earlier response of the same team (or free-tier client) whose conversation this
    #: one continues: its input and output come before ``input``
    previous_response_id: str | None = Field(None, min_length=1, max_length=100)
    #: keep the response for ``GET /v1/responses/{id}`` and for chaining
    store: StrictBool = True
    metadata: dict[str, str] | None = None
    text: TextConfig | None = None
    tool_choice: Literal["none", "auto"] | None = None
    truncation: Literal["disabled"] | None = None
    #: routing hints: turns that share one land on the same worker (and its cache)
    prompt_cache_key: str | None = None
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _messages_only(cls, value: Any) -> Any:
        # Validated here, item by item, so that an error names the item and the problem
        # (a union's error would only say the input is not a string).
        if isinstance(value, str | list) and not value:
            raise ValueError("the input is empty")
        if isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError("the input must be a string, or a list of messages")
        return [_message(index, item) for index, item in enumerate(value)]

    @field_validator("metadata")
    @classmethod
    def _metadata_bounds(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        if metadata is None:
            return None
        if len(metadata) > METADATA_PAIRS:
            raise ValueError(f"at most {METADATA_PAIRS} metadata pairs are allowed")
        for key, value in metadata.items():
            if len(key) > METADATA_KEY_CHARS:
                raise ValueError(f"metadata keys are at most {METADATA_KEY_CHARS} characters")
            if len(value) > METADATA_VALUE_CHARS:
                raise ValueError(f"metadata values are at most {METADATA_VALUE_CHARS} characters")
        return metadata

    def messages(self) -> list[InputMessage]:
        """``input`` as messages (a string is one user message)."""
        if isinstance(self.input, str):
            return [InputMessage(role="user", content=self.input)]
        return list(self.input)


def _message(index: int, item: Any) -> InputMessage:
    """Item ``index`` of ``input`` as a message, or a ValueError naming what is wrong."""
    if not isinstance(item, dict):
        raise ValueError(f"item {index} is not a message object")
    kind = item.get("type", "message")
    if kind != "message":
        raise ValueError(
            f"item {index} is of type {kind!r}; only messages with text content are "
            "supported (no tool calls, reasoning or item references)"
        )
    try:
        return InputMessage.model_validate(item)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in error["loc"] if not _is_type_tag(part))
        got = f" (got {error['input']!r})" if error["type"] == "literal_error" else ""
        message = error["msg"].removeprefix("Value error, ")
        raise ValueError(f"item {index}, {where or 'message'}: {message}{got}") from None


def _is_type_tag(part: Any) -> bool:
    """A union branch's name in an error location (``str``, ``list[...]``), not a field."""
    return isinstance(part, str) and (part in {"str", "int", "none"} or "[" in part)


def parse(data: dict[str, Any]) -> ResponseCreateRequest:
    """``data`` (a parsed JSON object) as a request; :class:`RequestError` names the field
    to fix, for a malformed value and for a feature this server cannot honour alike."""
    check_depth(data)
    for name, message in UNSUPPORTED.items():
        if data.get(name) not in (None, False, [], {}, ""):
            raise RequestError(message, param=name)
    choice = data.get("tool_choice")
    if choice is not None and choice not in NO_TOOL_CHOICES:
        raise RequestError(
            "tools are not supported on /v1/responses; remove 'tool_choice'", param="tool_choice"
        )
    if data.get("truncation") == "auto":
        raise RequestError(
            "truncation 'auto' is not supported: the input must fit the context; remove "
            "'truncation', or start a shorter conversation",
            param="truncation",
        )
    return validate(ResponseCreateRequest, data)
