"""A chart as the answer to a request: drawn off the event loop (tens of milliseconds of
matplotlib), with the media type of its format.

The caller imports its chart function from app.charts inside the route, so that matplotlib
loads only when a chart is asked for; this module imports it no sooner."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

T = TypeVar("T")


# The header that carries, beside an image, the warnings its JSON answer would hold.
WARNINGS_HEADER = "Batchplan-Warnings"


async def chart_response(
    draw: Callable[[T, str, str], bytes],
    data: T,
    fmt: str,
    title: str,
    warnings: tuple[str, ...] | None = None,
) -> Response:
    """The chart; with `warnings` (those its JSON answer lists), the Batchplan-Warnings header
    holds them as a JSON array (ASCII: a header is latin-1)."""
    from app.charts import MEDIA_TYPES  # loaded already: `draw` is one of its charts

    image = await run_in_threadpool(draw, data, fmt, title)
    headers = None if warnings is None else {WARNINGS_HEADER: json.dumps(list(warnings))}
    return Response(image, media_type=MEDIA_TYPES[fmt], headers=headers)
