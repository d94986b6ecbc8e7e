"""RFC 9457 problem+json for every error the service returns."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.core.errors import PlanError

PROBLEM_TYPE = "urn:batchplan:problem:"
MEDIA_TYPE = "application/problem+json"


def problem(
    status: int,
    slug: str,
    title: str,
    detail: str,
    *,
    errors: list[dict[str, str]] | None = None,
    suggestions: dict[str, list[int]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"type": PROBLEM_TYPE + slug, "title": title, "status": status, "detail": detail}
    if errors:
        body["errors"] = errors
    if suggestions:
        body["suggestions"] = suggestions
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def _pointer(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p != "body"]
    # pydantic names the branch of a nullable field ("int", "list[...]"): not a request path.
    parts = [
        p
        for p in parts
        if not p.startswith(("function-", "list[", "int", "float", "str", "bool")) or p.isdigit()
    ]
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts) if parts else ""


def _bound(err: dict[str, Any]) -> int | float | None:
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


async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = []
    suggestions: dict[str, list[int]] = {}
    malformed = False
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            malformed = True
        pointer = _pointer(tuple(err.get("loc", ())))
        message = err.get("msg", "invalid value")
        errors.append({"pointer": pointer, "detail": message})
        bound = _bound(err)
        if bound is not None and pointer:
            suggestions[pointer.rsplit("/", 1)[1]] = [int(bound)]
    if malformed:
        return problem(
            400, "malformed-body", "The request body is not valid JSON", errors[0]["detail"], errors=errors
        )
    first = errors[0] if errors else {"pointer": "", "detail": "invalid request"}
    where = first["pointer"] or "the body"
    return problem(
        422,
        "validation-error",
        "The request does not match the schema",
        f"{where}: {first['detail']}",
        errors=errors,
        suggestions=suggestions,
    )


async def _plan_error(request: Request, exc: PlanError) -> JSONResponse:
    return problem(
        422,
        exc.slug,
        exc.title,
        exc.detail,
        errors=[{"pointer": e.pointer, "detail": e.detail} for e in exc.errors],
        suggestions=exc.suggestions,
    )


async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    titles = {
        404: "Not found",
        405: "Method not allowed",
        401: "Unauthorized",
        413: "Request body too large",
        429: "Too many requests",
    }
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    return problem(
        exc.status_code,
        f"http-{exc.status_code}",
        titles.get(exc.status_code, "HTTP error"),
        detail,
        headers=dict(exc.headers) if exc.headers else None,
    )


async def _too_deep(request: Request, exc: RecursionError) -> JSONResponse:
    return problem(
        400, "malformed-body", "The request body is nested too deeply", "JSON nesting is too deep to parse"
    )


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    return problem(
        500,
        "internal-error",
        "Internal server error",
        "the server failed to handle this request; it has been logged",
    )


def _problem_media_types(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """OpenAPI that says what the handlers do: every 4xx/5xx body is problem+json.

    FastAPI documents a response `model` under application/json and adds its own
    HTTPValidationError for 422; both are moved to the one problem schema."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        problem_ref = {"$ref": "#/components/schemas/ProblemOut"}
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                for status, response in operation.get("responses", {}).items():
                    if status[:1] not in ("4", "5"):
                        continue
                    content = response.setdefault("content", {})
                    plain = content.pop("application/json", None) or {}
                    entry = content.setdefault(MEDIA_TYPE, {})
                    entry["schema"] = problem_ref
                    for key in ("example", "examples"):
                        if key in plain and key not in entry:
                            entry[key] = plain[key]
        components = schema.get("components", {}).get("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        app.openapi_schema = schema
        return schema

    return openapi


def install_problem_handlers(app: FastAPI) -> None:
    app.openapi = _problem_media_types(app)  # type: ignore[method-assign]
    app.add_exception_handler(RequestValidationError, _validation)  # type: ignore[arg-type]
    app.add_exception_handler(PlanError, _plan_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http)  # type: ignore[arg-type]
    app.add_exception_handler(RecursionError, _too_deep)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)


PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {
        "description": "Malformed body (not JSON, or not application/json).",
        "content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/ProblemOut"}}},
    },
    413: {
        "description": "Request body too large.",
        "content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/ProblemOut"}}},
    },
}
