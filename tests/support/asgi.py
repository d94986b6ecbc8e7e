"""One HTTP request straight through an ASGI app, with nothing between the test and the app:
the answer is the exact `http.response.start` headers (in order) and body bytes the server
would write, which a client library would parse and normalise."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message


@dataclass(frozen=True)
class Sent:
    """A request as the server hands it to the app: `chunks` > 1 sends the body in that many
    `http.request` messages without a Content-Length, as a chunked upload arrives."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""
    chunks: int = 1


@dataclass(frozen=True)
class Answer:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    scope: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def _scope(sent: Sent) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": sent.method,
        "scheme": "http",
        "path": sent.path,
        "raw_path": sent.path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in sent.headers],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }


async def _call(app: ASGIApp, sent: Sent) -> Answer:
    size = max(1, -(-len(sent.body) // sent.chunks))
    parts = [sent.body[i : i + size] for i in range(0, len(sent.body), size)] or [b""]
    incoming: list[Message] = [
        {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
        for i, part in enumerate(parts)
    ]
    outgoing: list[Message] = []

    async def receive() -> Message:
        if incoming:
            return incoming.pop(0)
        await asyncio.sleep(3600)  # the client stays connected: nothing more arrives
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        outgoing.append(message)

    scope = _scope(sent)
    await asyncio.wait_for(app(scope, receive, send), timeout=60)
    start = next(m for m in outgoing if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in outgoing if m["type"] == "http.response.body")
    headers = tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in start.get("headers", []))
    return Answer(start["status"], headers, body, scope)


def call(app: ASGIApp, sent: Sent) -> Answer:
    """Send one request through `app` (no lifespan: the planner does not need one)."""
    return asyncio.run(_call(app, sent))


def json_request(body: bytes, *, request_id: str, content_type: str | None = "application/json") -> Sent:
    """POST /v1/plans with `body`, its length, and a request id the answer echoes."""
    headers = [("host", "testserver"), ("x-request-id", request_id)]
    if content_type is not None:
        headers.append(("content-type", content_type))
    headers.append(("content-length", str(len(body))))
    return Sent("POST", "/v1/plans", tuple(headers), body)
