"""Shared request dependencies."""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request


def _presented_key(request: Request) -> str | None:
    header = request.headers.get("x-api-key")
    if header:
        return header
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


API_KEY_HELP = "send the API key as Authorization: Bearer <key> or X-API-Key"


async def require_api_key(request: Request) -> None:
    """When BATCHPLAN_API_KEY is set: `Authorization: Bearer <key>` or `X-API-Key: <key>`."""
    expected = request.app.state.settings.api_key
    if expected is None:
        return
    given = _presented_key(request)
    # compare_digest: the time taken does not tell how much of a guess was right
    if given is None or not hmac.compare_digest(given.encode(), expected.get_secret_value().encode()):
        raise HTTPException(
            401,
            API_KEY_HELP,
            headers={"WWW-Authenticate": 'Bearer realm="batchplan"'},
        )


async def require_planner_key(request: Request) -> None:
    """The API key on /v1/plans* as well, when BATCHPLAN_PROTECT_PLANNER=true."""
    if request.app.state.settings.protect_planner:
        await require_api_key(request)
