"""The parts of a request body that shape the reply: ``response_format`` (JSON, or JSON
following a schema) and ``tools`` (functions the model may call, and ``tool_choice``).

They are checked here as OpenAI documents them, so that a malformed one is a 400 naming
the field at the gateway already. Whether a schema compiles, and whether the model's chat
template takes tools, is the worker's to say: the built-in one constrains decoding to the
schema or the calls, SGLang workers get the fields as sent.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)

#: What OpenAI allows in a function's or a schema's name.
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class JsonSchemaSpec(_Part):
    """``response_format.json_schema``."""

    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    #: the JSON schema the reply follows; None: any JSON object
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    #: OpenAI's promise that the reply follows the schema exactly; the built-in engine
    #: keeps it with or without ``strict`` (decoding cannot leave the schema)
    strict: StrictBool | None = None


class ResponseFormat(_Part):
    """``response_format``: plain text, any JSON object, or JSON following a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError(
                "a 'json_schema' response format needs 'json_schema': {'name', 'schema'}"
            )
        return self


class FunctionDefinition(_Part):
    """A function the model may call."""

    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    #: a JSON schema of the arguments (an object); None: no parameters
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(_Part):
    """One entry of ``tools``."""

    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Part):
    name: str


class NamedToolChoice(_Part):
    """``tool_choice`` naming the one function the model must call."""

    type: Literal["function"]
    function: FunctionName


#: ``tool_choice``: no calls, the model's choice, at least one call, or the named function
ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(_Part):
    name: str
    #: the arguments as JSON text, as the model wrote them
    arguments: str


class ToolCallItem(_Part):
    """A call an earlier assistant turn made (``messages[i].tool_calls``)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolRequest(BaseModel):
    """The tool fields of a chat completion request (a base of its model)."""

    model_config = ConfigDict(extra="ignore")

    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    #: whether one reply may hold several calls (OpenAI's default: yes)
    parallel_tool_calls: StrictBool | None = None

    @field_validator("tool_choice")
    @classmethod
    def _choice_among_tools(
        cls, choice: str | NamedToolChoice | None, info: ValidationInfo
    ) -> str | NamedToolChoice | None:
        if choice is None or choice in ("none", "auto") or "tools" not in info.data:
            return choice  # (tools that failed their own check are reported as such)
        names = [t.function.name for t in info.data["tools"] or []]
        if not names:
            raise ValueError(f"{_said(choice)} needs 'tools' to choose from")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(
                f"names {choice.function.name!r}, which is not among the tools ({', '.join(names)})"
            )
        return choice

    @property
    def calls_allowed(self) -> bool:
        """Whether the reply may call tools (there are some, and ``tool_choice`` is not none)."""
        return bool(self.tools) and self.tool_choice != "none"


def _said(choice: str | NamedToolChoice) -> str:
    return repr(choice) if isinstance(choice, str) else f"function {choice.function.name!r}"
