"""Shared request dependencies."""

from __future__ import annotations

from fastapi import HTTPException, Request


async def require_json(request: Request) -> None:
    """A body that is not JSON is a 400 naming the content type, not a schema error."""
    content_type = request.headers.get("content-type")
    if content_type is None:
        # Without a content type FastAPI would not parse the body (a CSRF guard), and the
        # schema error that follows would not say why.
        if request.headers.get("content-length", "0") not in ("", "0") or \
                "chunked" in request.headers.get("transfer-encoding", ""):
            raise HTTPException(400, "send the body with Content-Type: application/json")
        return
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise HTTPException(400, f"send the body as application/json, not {media or 'nothing'}")
