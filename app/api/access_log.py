"""One access-log line per HTTP request: method, route template, path, status, duration, request id.

Pure ASGI and outermost, so that it times the whole request, including the 413s that
ServiceMiddleware answers itself. It reads the request id and the route from the scope those
layers fill in. When the `batchplan.access` logger is below its level (BATCHPLAN_LOG_LEVEL=warning)
it costs one `isEnabledFor` per request.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("batchplan.access")


class AccessLogMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not logger.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route: Any = scope.get("route")
            # Only FastAPI's own routes set scope["route"]; /openapi.json and the docs assets don't.
            template = getattr(route, "path", None) or "unmatched"
            duration_ms = round((time.perf_counter() - started) * 1000, 3)
            method, path = scope.get("method", ""), scope.get("path", "")
            logger.info(
                "%s %s %d %.1fms",
                method,
                path if template == "unmatched" else template,
                status,
                duration_ms,
                extra={
                    "method": method,
                    "route": template,
                    "path": path,
                    "status": status,
                    "duration_ms": duration_ms,
                },
            )
