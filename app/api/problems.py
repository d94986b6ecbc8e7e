"""RFC 9457 problem+json for every error the service returns."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.core.errors.domain import DomainError
from app.core.errors.problems import (
    MEDIA_TYPE,
    Problem,
    domain_problem,
    malformed_json,
    problem_body,
    problem_json,
    retry_headers,
    too_large,
    unsupported_media_type,
    validation_problem,
)
from app.schemas.field_hints import with_field_hints
from app.schemas.problem import ProblemOut


def problem(
    status: int,
    slug: str,
    title: str,
    detail: str,
    *,
    errors: list[dict[str, str]] | None = None,
    suggestions: dict[str, list[int]] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    body = problem_body(status, slug, title, detail, errors=errors, suggestions=suggestions)
    return _respond(body, headers)


def _respond(body: Problem, headers: dict[str, str] | None = None) -> Response:
    return Response(problem_json(body), status_code=body["status"], media_type=MEDIA_TYPE, headers=headers)


async def _validation(request: Request, exc: RequestValidationError) -> Response:
    # FastAPI keeps the undecodable text as the error's body: the line and column come from it.
    document = exc.body if isinstance(exc.body, (str, bytes)) else None
    errors = with_field_hints(exc.errors(), _validated_models(request))
    check = SUGGESTION_CHECKS.get(getattr(request.scope.get("route"), "path", ""))
    if check is not None:
        errors = check(request, exc.body, errors)
    return _respond(validation_problem(errors, document))


# Route path -> what tries the suggestions of errors outside a plan request (the routers add
# theirs): (request, the parsed body, the errors) -> the errors with their suggestions tried.
SUGGESTION_CHECKS: dict[str, Callable[[Request, Any, list[dict[str, Any]]], list[dict[str, Any]]]] = {}


def _validated_models(request: Request) -> dict[str, Any]:
    """The model each part of the request ("body") was validated against, for field hints."""
    body = getattr(request.scope.get("route"), "body_field", None)
    return {"body": body.field_info.annotation} if body is not None else {}


async def _domain_error(request: Request, exc: DomainError) -> Response:
    return _respond(domain_problem(exc), retry_headers(exc))


async def _http(request: Request, exc: StarletteHTTPException) -> Response:
    titles = {
        404: "Not found",
        405: "Method not allowed",
        401: "Unauthorized",
        413: "Request body too large",
        429: "Too many requests",
    }
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    headers = dict(exc.headers) if exc.headers else None
    if exc.status_code == 405:
        detail, headers = _method_not_allowed(request, headers or {})
    return problem(
        exc.status_code,
        f"http-{exc.status_code}",
        titles.get(exc.status_code, "HTTP error"),
        detail,
        headers=headers,
    )


def _method_not_allowed(request: Request, headers: dict[str, str]) -> tuple[str, dict[str, str]]:
    """Starlette's "Method Not Allowed" leaves the caller guessing, and its Allow header names
    only the first route of the path (GET of /v1/checks/{check_id}, not DELETE): the OpenAPI
    document lists every method of the path the request matched."""
    template = getattr(request.scope.get("route"), "path", None)
    operations = request.app.openapi().get("paths", {}).get(template, {}) if template else {}
    methods = sorted(m.upper() for m in operations)
    if not methods:
        return "Method Not Allowed", headers
    detail = f"{request.method} is not served at {template}; use {' or '.join(methods)}"
    return detail, {**headers, "Allow": ", ".join(methods)}


async def _too_deep(request: Request, exc: RecursionError) -> Response:
    return problem(
        400, "malformed-body", "The request body is nested too deeply", "JSON nesting is too deep to parse"
    )


async def _unexpected(request: Request, exc: Exception) -> Response:
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
    app.add_exception_handler(DomainError, _domain_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http)  # type: ignore[arg-type]
    app.add_exception_handler(RecursionError, _too_deep)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)


def problem_response(description: str, examples: dict[str, Problem]) -> dict[str, Any]:
    """An error response as OpenAPI documents it, with its own examples (without them Swagger
    shows ProblemOut's, an infeasible plan, under every status)."""
    return {
        "model": ProblemOut,  # registers the component that the content refers to
        "description": description,
        "content": {
            MEDIA_TYPE: {
                "schema": {"$ref": "#/components/schemas/ProblemOut"},
                "examples": {name: {"value": value} for name, value in examples.items()},
            }
        },
    }


# A body the 400 example answers, kept beside it so a test can send it (tests/api).
NOT_JSON_EXAMPLE = '{"topology": {"num_nodes": 2, "gpus_per_node": 8}\n  "global_batch_size": 512}'


def refusal(call: Callable[[], object]) -> Problem:
    """The problem the service answers when `call` (a request, validated and served) fails:
    documented examples are computed, so they are what the service really says."""
    try:
        call()
    except DomainError as err:
        return domain_problem(err)
    except ValidationError as err:
        return validation_problem(err.errors())
    raise AssertionError("an example meant to fail was accepted")


PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: problem_response(
        "Malformed body (not JSON, or not application/json).",
        {
            "not_json": malformed_json(
                "Expecting ',' delimiter", NOT_JSON_EXAMPLE, NOT_JSON_EXAMPLE.index("\n") + 3
            ),
            "wrong_content_type": unsupported_media_type("send the body as application/json, not text/plain"),
        },
    ),
    413: problem_response("Request body too large.", {"too_large": too_large(4 * 1024 * 1024)}),
}
