"""Pure ASGI middleware: request ids, body-size limit, request metrics.

Pure ASGI rather than BaseHTTPMiddleware: it adds no task per request, which keeps
/v1/plans close to the server's own floor (see bench/bench_http.py).
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.metrics import Metrics
from app.core.errors.problems import MEDIA_TYPE, Problem, problem_json, too_large, unsupported_media_type
from app.logging_setup import request_id_var

_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# A body over the limit is read (and dropped) up to this much before the 413: a client that
# sends its whole body before it reads the answer (Python's urllib) would otherwise see the
# connection reset, not the 413. Past it the server answers and closes: reading more would let
# any client make it read without end.
DRAIN_BYTES = 64 * 1024 * 1024


def _not_json(headers: dict[bytes, bytes], length: int) -> str | None:
    """Why a request body is not JSON, or None. Every body this API takes is JSON; saying so
    here, before routing, gives a 400 that names the content type instead of a schema error,
    and costs the hot path less than a FastAPI dependency."""
    content_type = headers.get(b"content-type")
    if content_type is None:
        # Without a content type FastAPI would not parse the body (a CSRF guard).
        if length or b"chunked" in headers.get(b"transfer-encoding", b""):
            return "send the body with Content-Type: application/json"
        return None
    media = content_type.split(b";", 1)[0].strip().lower().decode("latin-1")
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return None
    return f"send the body as application/json, not {media or 'nothing'}"


async def _drain(receive: Receive, length: int) -> None:
    """Read the request's body, `length` bytes at most, and drop it."""
    read = 0
    while read < length:
        message = await receive()
        if message["type"] != "http.request":
            return  # the client went away
        read += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


class ServiceMiddleware:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int, metrics: Metrics) -> None:
        self.app = app
        self.max_body = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-request-id", b"")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex.encode()
        scope.setdefault("state", {})["request_id"] = request_id.decode()
        request_id_var.set(scope["state"]["request_id"])  # for every log line of this request
        status_holder = {"status": 500}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id)]
            await send(message)

        try:
            length = int(headers.get(b"content-length", b"0") or 0)
        except ValueError:
            length = 0
        if length > self.max_body:
            if length <= DRAIN_BYTES:
                await _drain(receive, length)
            await self._reject(send_with_id, too_large(self.max_body))
            self._observe(scope, 413, started)
            return
        if scope.get("method") in _BODY_METHODS:
            wrong = _not_json(headers, length)
            if wrong:
                await self._reject(send_with_id, unsupported_media_type(wrong))
                self._observe(scope, 400, started)
                return

        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    # An HTTPException is what FastAPI lets through its body parsing
                    # untouched (anything else becomes a 400), and the app's handler
                    # renders it as problem+json.
                    raise HTTPException(413, too_large(self.max_body)["detail"])
            return message

        await self.app(scope, limited_receive, send_with_id)
        self._observe(scope, status_holder["status"], started)

    async def _reject(self, send: Send, problem: Problem) -> None:
        """Answer before routing, in the shape and serialisation of every other problem."""
        body = problem_json(problem)
        await send(
            {
                "type": "http.response.start",
                "status": problem["status"],
                "headers": [
                    (b"content-type", MEDIA_TYPE.encode()),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _observe(self, scope: Scope, status: int, started: float) -> None:
        route: Any = scope.get("route")
        template = getattr(route, "path", None) or "unmatched"
        self.metrics.observe_request(scope.get("method", ""), template, status, time.perf_counter() - started)
