"""POST /v1/plans without FastAPI's request machinery, for the bodies it can answer: pure ASGI.

A plan costs less than FastAPI spends getting to it (routing, the dependency solver, the body
read through `Request`, a content-type parse through `email.message`): bench/profile_http.py
shows where. This middleware sits innermost, inside the request-id, metrics and access-log
middleware, so they see every request as before. For `POST /v1/plans` with one JSON body of a
stated length it reads the body, parses and validates it with the route's own model in one pass
(pydantic's `validate_json`, which accepts the same UTF-8 bodies as the route's `json.loads`
then `validate_python`, at two thirds of the cost; whatever it refuses, such as a UTF-16 body or
a byte-order mark that `json.loads` decodes, takes the route) and answers with
the route's own function (`plans.plan_answer`) and the headers of its response; a planner
refusal goes to the app's own handler for it. Anything else goes to the FastAPI route with the body replayed,
untouched: a schema error, a body that is not JSON, a chunked upload, any other content type,
the API key on the planner, FastAPI's telemetry, any failure of its own. The route stays the
one that OpenAPI documents, and tests/api/test_plan_fast_path.py holds the two to the same
bytes.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.measured_lr import needs_lookup
from app.api.plans import plan_answer
from app.core.errors.domain import DomainError
from app.schemas.plan_requests import SCREEN, PlanRequestIn

PATH = "/v1/plans"
_VALIDATE_JSON = PlanRequestIn.__pydantic_validator__.validate_json
_JSON = (b"content-type", b"application/json")


class _LooksUp(Exception):
    """The body names an lr-scaling probe by id: the route looks it up in the check store."""


def answer(body: bytes) -> bytes:
    """The 200 body for a plan request's bytes; a ValidationError when they are not one."""
    request = _VALIDATE_JSON(body, context=SCREEN)
    if needs_lookup(request):
        raise _LooksUp
    return plan_answer(request)


def _json_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The body's length when the request is plain JSON with one Content-Length, else None."""
    length = media = None
    for name, value in headers:
        if name == b"content-length":
            if length is not None:
                return None
            length = value
        elif name == b"content-type":
            if media is not None:
                return None
            media = value.split(b";", 1)[0].strip().lower()
        elif name == b"transfer-encoding":
            return None
    if media != b"application/json" or length is None or not length.isdigit():
        return None
    return int(length)


class PlanFastPath:
    def __init__(self, app: ASGIApp, *, route: Any, exception_handlers: dict[Any, Any]) -> None:
        self.app = app
        self.route = route  # what scope["route"] holds after routing: metrics and logs read its path
        self.handlers = exception_handlers  # the app's own, looked up when an error happens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] != PATH
            or scope.get("root_path")
            or "fastapi.telemetry" in scope  # tracing wants the route's spans
        ):
            await self.app(scope, receive, send)
            return
        length = _json_length(scope["headers"])
        if length is None:
            await self.app(scope, receive, send)
            return
        messages, body = await self._read(receive)
        if body is None or len(body) != length:
            await self.app(scope, _replay(messages, receive), send)
            return
        try:
            content = answer(body)
        except DomainError as err:
            handler = self._handler(err)
            if handler is None:
                await self.app(scope, _replay(messages, receive), send)
                return
            scope["route"] = self.route
            response = await handler(Request(scope, receive), err)
            await response(scope, receive, send)
            return
        except Exception:  # the route answers it, in its own words
            await self.app(scope, _replay(messages, receive), send)
            return
        # What the route's Response(content, media_type="application/json") sends.
        scope["route"] = self.route
        headers = [(b"content-length", str(len(content)).encode()), _JSON]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    def _handler(self, err: Exception) -> Any:
        """The handler Starlette would pick for `err`: the nearest class in its MRO."""
        for cls in type(err).__mro__:
            if cls in self.handlers:
                return self.handlers[cls]
        return None

    @staticmethod
    async def _read(receive: Receive) -> tuple[list[Message], bytes | None]:
        """Every message up to the body's end; the body, or None when something else came."""
        messages: list[Message] = []
        chunks: list[bytes] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages, None
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return messages, b"".join(chunks)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that hands back what was already read, then the server's own."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
