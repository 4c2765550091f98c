"""The OpenAPI document served at ``/openapi.json``: what the gateway's endpoints are."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from protocol.openai_requests import ChatCompletionRequest, CompletionRequest
from protocol.responses import ResponseCreateRequest

_ERROR = {"$ref": "#/components/schemas/Error"}
_RATE_HEADERS = {
    name: {"schema": {"type": "string"}}
    for name in (
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    )
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _request_schemas() -> dict[str, Any]:
    """The request bodies as JSON Schema, drawn from the models the gateway and the workers
    validate with (:mod:`protocol.openai_requests`), so the document says what is accepted.

    Checks JSON Schema cannot say (one choice, seeds within 64 bits, no empty stop string)
    are the models' validators: a body that breaks one is a 400 naming the field.
    """
    _, top = models_json_schema(
        [
            (ChatCompletionRequest, "validation"),
            (CompletionRequest, "validation"),
            (ResponseCreateRequest, "validation"),
        ],
        ref_template="#/components/schemas/{model}",
    )
    return top["$defs"]


def _error(description: str) -> dict[str, Any]:
    """A response in OpenAI's error shape."""
    return {"description": description, "content": {"application/json": {"schema": _ERROR}}}


def _completion(
    summary: str,
    request: type[BaseModel],
    not_found: str = "No healthy worker serves this model.",
) -> dict[str, Any]:
    errors = {
        str(code): _error(text)
        for code, text in (
            (400, "Invalid request (OpenAI error shape)."),
            (401, "Malformed, unknown or revoked API key."),
            (404, not_found),
            (413, "Request body too large."),
            (429, "Rate limited; see Retry-After and x-should-retry."),
            (502, "The worker failed."),
            (503, "No worker available, or keys cannot be verified right now."),
        )
    }
    return {
        "post": {
            "summary": summary,
            "security": [{"bearer": []}, {}],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref(request.__name__)}},
            },
            "responses": {
                "200": {
                    "description": "A completion (JSON), or server-sent events when streaming.",
                    "headers": _RATE_HEADERS,
                    "content": {"application/json": {}, "text/event-stream": {}},
                },
                **errors,
            },
        }
    }


def _stored_response() -> dict[str, Any]:
    """``/v1/responses/{response_id}``: a stored response, read or deleted by its owner."""
    parameter = {
        "name": "response_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
    }
    errors = {
        "401": _error("A kvg_ key that is malformed, unknown or revoked"),
        "404": _error("No such response of the caller's (another team's reads as missing)"),
        "503": _error("Stored responses cannot be read right now"),
    }
    return {
        "get": {
            "summary": "A stored response",
            "security": [{"bearer": []}, {}],
            "parameters": [
                parameter,
                {"name": "stream", "in": "query", "required": False, "schema": {"type": "string"}},
            ],
            "responses": {
                "200": {"description": "The response object", "content": {"application/json": {}}},
                "400": _error("stream=true: replaying events is not supported"),
                **errors,
            },
        },
        "delete": {
            "summary": "Delete a stored response",
            "security": [{"bearer": []}, {}],
            "parameters": [parameter],
            "responses": {
                "200": {
                    "description": "{id, object: response, deleted: true}",
                    "content": {"application/json": {}},
                },
                **errors,
            },
        },
    }


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 description of the gateway."""
    plain = {"get": {"responses": {"200": {"description": "OK"}}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "kvgate gateway", "version": "1"},
        "paths": {
            "/v1/chat/completions": _completion("Chat completion", ChatCompletionRequest),
            "/v1/completions": _completion("Text completion", CompletionRequest),
            "/v1/responses": _completion(
                "Create a response (OpenAI's Responses API, text only; stored for "
                "previous_response_id unless store is false)",
                ResponseCreateRequest,
                "No healthy worker serves this model, or previous_response_id names no "
                "stored response of the caller's.",
            ),
            "/v1/responses/{response_id}": _stored_response(),
            "/v1/models": {
                "get": {
                    "summary": "Models served by healthy workers",
                    "responses": {
                        "200": {"description": "OpenAI model list"},
                        "401": _error("A kvg_ key that is malformed, unknown or revoked"),
                    },
                }
            },
            "/v1/models/{model}": {
                "get": {
                    "summary": "One model served by healthy workers",
                    "parameters": [
                        {
                            "name": "model",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": {"description": "OpenAI model object"},
                        "401": _error("A kvg_ key that is malformed, unknown or revoked"),
                        "404": _error("No healthy worker serves this model"),
                    },
                }
            },
            "/healthz": {"get": {"summary": "Process is alive", **plain["get"]}},
            "/readyz": {"get": {"summary": "Database reachable", **plain["get"]}},
            "/metrics": {"get": {"summary": "Prometheus metrics", **plain["get"]}},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                **_request_schemas(),
                "Error": {
                    "type": "object",
                    "properties": {
                        "error": {
                            "type": "object",
                            "properties": {
                                "message": {"type": "string"},
                                "type": {"type": "string"},
                                "param": {"type": ["string", "null"]},
                                "code": {"type": ["string", "null"]},
                            },
                        }
                    },
                },
            },
        },
    }
