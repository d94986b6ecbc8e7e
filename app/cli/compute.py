"""The answers of `plan` and `export`: computed here with the core, or by a server (--url),
identical either way; and the client every --url command uses."""

from __future__ import annotations

import json
import logging

from pydantic import ValidationError

from app.cli.errors import client_errors, fail, validation_problem_of
from app.cli.output import table
from app.client import BatchplanClient, Json
from app.core.errors.domain import PlanError
from app.core.errors.problems import domain_problem
from app.core.exports.registry import EXPORTERS, plan_and_export, unknown_format
from app.core.planner import plan as plan_locally
from app.schemas.plan_requests import PlanRequestIn
from app.schemas.plan_responses import PlanOut


def make_client(url: str, api_key: str | None) -> BatchplanClient:
    """The client every --url command uses."""
    # A command prints its answer, not httpx's request log (when something set up INFO logging).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return BatchplanClient(url, api_key=api_key, timeout=60.0)


def compute(body: Json, url: str | None, api_key: str | None = None) -> Json:
    """The plan as JSON, identical whether computed here or by a server."""
    if url:
        with client_errors(), make_client(url, api_key) as client:
            return client.plan(body)
    try:
        request = PlanRequestIn.model_validate(body)
        return PlanOut.model_validate(plan_locally(request.to_core())).model_dump(mode="json")
    except ValidationError as err:
        fail(validation_problem_of(("body", err), models={"body": PlanRequestIn}))
    except PlanError as err:
        fail(domain_problem(err))


def export_text(fmt: str, body: Json, options: Json, url: str | None, api_key: str | None = None) -> str:
    """An export, identical whether written here or by a server."""
    if url:
        with client_errors(), make_client(url, api_key) as client:
            return client.export(fmt, body, **options)
    from app.schemas.exports import ExportOptionsIn

    # FastAPI reports query errors before body errors: the same order here.
    invalid: list[tuple[str, ValidationError]] = []
    try:
        export_options = ExportOptionsIn.model_validate(options)
    except ValidationError as err:
        invalid.append(("query", err))
    try:
        request = PlanRequestIn.model_validate(body)
    except ValidationError as err:
        invalid.append(("body", err))
    if invalid:
        from app.schemas.checked_options import checked_option_errors

        check = lambda errors: checked_option_errors(fmt, body, options, errors)  # noqa: E731
        fail(validation_problem_of(*invalid, models={"body": PlanRequestIn}, check=check))
    if fmt not in EXPORTERS:
        fail(domain_problem(unknown_format(fmt)))
    try:
        return plan_and_export(fmt, request.to_core(), export_options.to_core()).text
    except PlanError as err:
        fail(domain_problem(err))


def render(fmt: str, body: Json, options: Json, url: str | None, api_key: str | None) -> str:
    """What `plan --format FMT` prints: the plan as JSON or as a table, or an export."""
    if fmt == "json":
        return json.dumps(compute(body, url, api_key), indent=2)
    if fmt == "table":
        return table(compute(body, url, api_key))
    return export_text(fmt, body, options, url, api_key)
