"""The JSON of a request body as every route reads it (`core.json_text.parse`): whatever is
not JSON becomes the `JSONDecodeError` that FastAPI answers as a malformed body (400
`malformed-body`, with the line and column; CONTRACT.md).

FastAPI answers a `JSONDecodeError` from `Request.json()` with the parser's message and place;
any other failure of the parse (bytes that are not UTF-8, nesting deeper than the parser's
recursion, an integer of more digits than Python converts) it answers with a bare 400, "There
was an error parsing the body", which says neither what nor where. `JsonBodyRoute` gives the
routes a request whose `json()` says both.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from app.core.request.json_text import parse


class JsonBodyRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse(await self.body())
        return self._json


class JsonBodyRoute(APIRoute):
    """A route that reads its JSON body with `parse`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def with_json_body(request: Request) -> Response:
            return await handler(JsonBodyRequest(request.scope, request.receive))

        return with_json_body
