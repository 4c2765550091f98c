"""Security headers on every response: CSP, framing, referrer and content-type sniffing.

Pure ASGI (like ``gateway.middleware``) so streamed completions pass through unbuffered.
The CSP allows only this origin's scripts, styles and connections: the pages use no inline
script or style (charts are inline SVG with classes), so an injected ``<script>`` cannot run.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'self'; "
    "object-src 'none'"
)

HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"strict-origin-when-cross-origin"),
    (b"x-content-type-options", b"nosniff"),
)
_NAMES = {name for name, _ in HEADERS}
#: the same headers as text, for a response made outside the middleware
SECURITY_HEADERS: dict[str, str] = {name.decode(): value.decode() for name, value in HEADERS}


class SecurityHeadersMiddleware:
    """Adds :data:`HEADERS` to every HTTP response (replacing any a handler set)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [h for h in message.get("headers", []) if h[0].lower() not in _NAMES]
                message["headers"] = [*kept, *HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)
