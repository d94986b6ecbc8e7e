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
from app.api.problems import MEDIA_TYPE, PROBLEM_TYPE
from app.logging_setup import request_id_var

_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")


def _problem_bytes(status: int, title: str, detail: str) -> bytes:
    import json

    return json.dumps(
        {"type": PROBLEM_TYPE + f"http-{status}", "title": title, "status": status, "detail": detail}
    ).encode()


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
            await self._reject(send_with_id, request_id, scope)
            self._observe(scope, 413, started)
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
                    raise HTTPException(413, f"the body is over the limit of {self.max_body} bytes")
            return message

        await self.app(scope, limited_receive, send_with_id)
        self._observe(scope, status_holder["status"], started)

    async def _reject(self, send: Send, request_id: bytes, scope: Scope) -> None:
        body = _problem_bytes(
            413, "Request body too large", f"the body is over the limit of {self.max_body} bytes"
        )
        await send(
            {
                "type": "http.response.start",
                "status": 413,
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
