"""RFC 9457 problem bodies, built the same way for the HTTP API and the CLI.

The one table from an error's kind to its HTTP status lives here, so the routers raise
domain errors and nothing else, and `batchplan plan` prints the body the server would send.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from app.core.errors.domain import DomainError, ErrorKind, field_key

PROBLEM_TYPE = "urn:batchplan:problem:"
MEDIA_TYPE = "application/problem+json"

STATUS_BY_KIND: dict[ErrorKind, int] = {
    ErrorKind.INVALID: 422,
    ErrorKind.INFEASIBLE: 422,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.CONFLICT: 409,
    ErrorKind.BUSY: 429,
    ErrorKind.UNAVAILABLE: 503,
}

Problem = dict[str, Any]


def problem_body(
    status: int,
    slug: str,
    title: str,
    detail: str,
    *,
    errors: list[dict[str, str]] | None = None,
    suggestions: Mapping[str, list[int]] | None = None,
    combined_suggestions: list[dict[str, int]] | None = None,
) -> Problem:
    body: Problem = {"type": PROBLEM_TYPE + slug, "title": title, "status": status, "detail": detail}
    if errors:
        body["errors"] = errors
    if suggestions:
        body["suggestions"] = dict(suggestions)
    if combined_suggestions:
        body["combined_suggestions"] = [dict(change) for change in combined_suggestions]
    return body


def problem_json(body: Problem) -> bytes:
    """The one serialisation of a problem, whichever layer answers: compact, as FastAPI's
    JSONResponse writes every other body."""
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def malformed_json(message: str, document: str | bytes | None, position: int | None) -> Problem:
    """400 for a body that is not JSON: the parser's message with the line and column where it
    stopped. No `errors`: a character offset is not a JSON Pointer into anything."""
    where = ""
    if document is not None and position is not None:
        text = document.decode("utf-8", "replace") if isinstance(document, bytes) else document
        line = text.count("\n", 0, position) + 1
        column = position - text.rfind("\n", 0, position)
        where = f" at line {line}, column {column}"
    detail = f"the body is not valid JSON: {message}{where}"
    return problem_body(400, "malformed-body", "The request body is not valid JSON", detail)


def unsupported_media_type(detail: str) -> Problem:
    """400 for a body sent as something other than JSON (the contract allows 400 or 422)."""
    return problem_body(400, "unsupported-media-type", "The request body is not JSON", detail)


# The setting (app.settings, prefix BATCHPLAN_) that sets the body limit: a 413 names it.
BODY_LIMIT_SETTING = "BATCHPLAN_MAX_BODY_BYTES"


def too_large(limit: int) -> Problem:
    detail = (
        f"the body is over the limit of {limit} bytes ({BODY_LIMIT_SETTING}={limit} on this server; "
        f"a larger value raises it)"
    )
    return problem_body(413, "http-413", "Request body too large", detail)


def domain_problem(err: DomainError) -> Problem:
    return problem_body(
        STATUS_BY_KIND[err.kind],
        err.slug,
        err.title,
        err.detail,
        errors=[{"pointer": e.pointer, "detail": e.detail} for e in err.errors],
        suggestions=err.suggestions,
        combined_suggestions=err.combined_suggestions,
    )


def retry_headers(err: DomainError) -> dict[str, str] | None:
    return {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None


def _pointer(loc: Iterable[Any]) -> str:
    parts = [str(p) for p in loc if p != "body"]
    # pydantic names the branch of a nullable field ("int", "list[...]"): not a request path.
    parts = [
        p
        for p in parts
        if not p.startswith(("function-", "list[", "int", "float", "str", "bool")) or p.isdigit()
    ]
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts) if parts else ""


def nearest_bound(err: Mapping[str, Any]) -> int | None:
    """The nearest valid value for a range error, when it is a whole bound."""
    ctx = err.get("ctx") or {}
    for key in ("ge", "le"):
        if key in ctx and isinstance(ctx[key], int):
            return int(ctx[key])
    if "gt" in ctx and isinstance(ctx["gt"], int) and isinstance(err.get("input"), int):
        return int(ctx["gt"]) + 1
    if "lt" in ctx and isinstance(ctx["lt"], int) and isinstance(err.get("input"), int):
        return int(ctx["lt"]) - 1
    return None


CHECKED = "checked_suggestions"
"""The `ctx` key of a schema error whose suggestions were already tried on the request: the
plan request's validator (app.schemas) sets it, and only the values that plan are kept."""


EMPTY_BODY = "the body is empty: send the request as a JSON object"
# pydantic's error types for a value that is not a number (the plan request's counts raise
# int_type for strings and booleans themselves, app.schemas.types).
_NUMBER_ERRORS = frozenset({"int_type", "int_parsing", "float_type", "float_parsing"})
_NUMERAL = re.compile(r"^\s*-?[0-9][0-9_]*(\.[0-9]+)?([eE][-+]?[0-9]+)?\s*$")


def _message(err: Mapping[str, Any], pointer: str) -> str:
    """pydantic's message, said so that a newcomer sees what to send instead: a JSON number
    where a string was sent (`"2"` reads as a number in Python, not in the schema), and a body
    at all where none came (FastAPI calls that a missing field at the root)."""
    msg = str(err.get("msg", "invalid value"))
    given = err.get("input")
    if not pointer and err.get("type") == "missing":
        return EMPTY_BODY
    if err.get("type") in _NUMBER_ERRORS and isinstance(given, str):
        if _NUMERAL.match(given) and len(given) <= 40:
            return f'{msg}: a JSON number, not a string (send {given.strip()}, not "{given.strip()}")'
        return f"{msg}: a JSON number, not a string"
    if err.get("type") in _NUMBER_ERRORS and isinstance(given, bool):
        return f"{msg}: a JSON number, not {'true' if given else 'false'}"
    return msg


def validation_problem(
    schema_errors: Iterable[Mapping[str, Any]], document: str | bytes | None = None
) -> Problem:
    """The problem for schema errors in pydantic's shape (`loc`, `msg`, `type`, `ctx`, `input`):
    400 for a body that is not JSON (`document` is the body, for the line and column), else 422
    naming each field and the nearest valid value."""
    errors = []
    suggestions: dict[str, list[int]] = {}
    for err in schema_errors:
        ctx = err.get("ctx") or {}
        if err.get("type") == "json_invalid":
            loc = tuple(err.get("loc", ()))
            position = loc[-1] if loc and isinstance(loc[-1], int) else None
            return malformed_json(str(ctx.get("error", "invalid JSON")), document, position)
        pointer = _pointer(tuple(err.get("loc", ())))
        errors.append({"pointer": pointer, "detail": _message(err, pointer)})
        if not pointer:
            continue
        values = list(ctx[CHECKED]) if CHECKED in ctx else [b for b in [nearest_bound(err)] if b is not None]
        if values:
            suggestions.setdefault(field_key(pointer), values)
    first = errors[0] if errors else {"pointer": "", "detail": "invalid request"}
    where = first["pointer"] or "the body"
    detail = first["detail"] if first["detail"] == EMPTY_BODY else f"{where}: {first['detail']}"
    return problem_body(
        422,
        "validation-error",
        "The request does not match the schema",
        detail,
        errors=errors,
        suggestions=suggestions,
    )
