"""An export option out of range (the query's `port`, `cpus_per_gpu`) is suggested its bound
only where the request then exports in that format, as a plan request's suggestions are
tried before they are given. Used by the API's error handler and by `batchplan export`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from app.core.errors.domain import DomainError
from app.core.errors.problems import CHECKED, nearest_bound
from app.core.exports.parts.export_types import ExportInput
from app.core.exports.registry import EXPORTERS
from app.core.planner import plan
from app.schemas.exports import ExportOptionsIn
from app.schemas.plan_requests import PlanRequestIn

QUERY = "query"


def exports(fmt: str, body: Any, options: Mapping[str, Any]) -> bool:
    """Whether the body exports in `fmt` with these options."""
    try:
        request = PlanRequestIn.model_validate(body).to_core()
        EXPORTERS[fmt](ExportInput(request, plan(request), ExportOptionsIn.model_validate(options).to_core()))
    except (DomainError, ValidationError, KeyError):
        return False
    return True


def checked_option_errors(
    fmt: str, body: Any, options: Mapping[str, Any], errors: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`errors` (FastAPI's, located "query"/"body") with each query error's suggestion tried:
    its bound where the request then exports, else none. Only a request wrong in one place
    gets one, as for plan requests."""
    single = len({tuple(e.get("loc", ())) for e in errors}) == 1
    out = []
    for err in errors:
        loc = tuple(err.get("loc", ()))
        if loc[:1] != (QUERY,) or len(loc) < 2:
            out.append(err)
            continue
        bound = nearest_bound(err)
        works = single and bound is not None and exports(fmt, body, {**options, loc[1]: bound})
        out.append({**err, "ctx": {**(err.get("ctx") or {}), CHECKED: [bound] if works else []}})
    return out
