"""How a command fails: a problem (RFC 9457, as a server answers it, or one of the CLI's own)
printed to stderr with its field's flag, its further errors and its suggestions, and exit
status 2; a server's problem or a client error the same way. Every command reaches its
errors here; output.py renders what succeeded."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import typer
from pydantic import ValidationError

from app.cli.flag_names import in_flags, suggestion_lines
from app.client import BatchplanError, Json, ProblemError
from app.core.errors.problems import validation_problem
from app.schemas.field_hints import with_field_hints


def fail(problem: Json, code: int = 2) -> NoReturn:
    suggestions = problem.get("suggestions") or {}
    problem = in_flags(problem)  # `-b`, not `global_batch_size`, where flags made the request
    typer.echo(f"error: {problem.get('detail') or problem.get('title') or 'request failed'}", err=True)
    errors = problem.get("errors") or []
    for item in errors[1:] if isinstance(errors, list) else []:
        if isinstance(item, dict):
            typer.echo(f"  {item.get('pointer') or '/'}: {item.get('detail')}", err=True)
    for line in suggestion_lines(suggestions) if isinstance(suggestions, dict) else []:
        typer.echo(f"  try {line}", err=True)
    raise typer.Exit(code)


def fail_client(err: BatchplanError) -> NoReturn:
    if isinstance(err, ProblemError):
        problem = dict(err.problem)
        if err.status == 401:
            problem["detail"] = f"{err.detail} (give --api-key or set BATCHPLAN_API_KEY)"
        if err.retry_after is not None:
            problem["detail"] = f"{err.detail} (Retry-After: {err.retry_after:g} s)"
        fail(problem)
    fail({"detail": str(err)})


def validation_problem_of(
    *errors: tuple[str, ValidationError],
    models: dict[str, Any] | None = None,
    check: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None,
) -> Json:
    """As the server reports schema errors; `where` is FastAPI's location ("body", "query"),
    `models` the model validated there (for "did you mean" on a misspelt field), `check` what
    tries the suggestions of errors outside a plan request (app.api.problems.SUGGESTION_CHECKS)."""
    located = [{**e, "loc": (where, *e["loc"])} for where, err in errors for e in err.errors()]
    hinted = with_field_hints(located, models or {})
    return validation_problem(check(hinted) if check is not None else hinted)


@contextlib.contextmanager
def client_errors() -> Iterator[None]:
    try:
        yield
    except BatchplanError as err:
        fail_client(err)
