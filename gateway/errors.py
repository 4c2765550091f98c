"""OpenAI-shaped error responses, and the exception handlers raise to produce one."""

from __future__ import annotations

import orjson
from starlette.responses import Response

from protocol.openai_errors import error_body


class ApiError(Exception):
    """Ends a request with an OpenAI-shaped error; ``headers`` go on the response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def response(self) -> Response:
        """This error as the JSON response an OpenAI client understands."""
        body = error_body(self.status, self.message, param=self.param, code=self.code)
        return Response(
            orjson.dumps(body), self.status, self.headers, media_type="application/json"
        )
