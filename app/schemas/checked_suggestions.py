"""Suggestions for a plan request that fails the schema, each one tried before it is given.

A schema error's nearest bound is not always a value that plans: `global_batch_size: -5` on
16 GPUs is bounded by 1, and 1 sample cannot be shared by 16 replicas. So, as for infeasible
plans, every candidate (the bound, a whole number next to a fractional one, and the planner's
own suggestions for that field once the bound is in place) is substituted into the request
with everything else unchanged, validated and planned; only the values that plan are kept,
under the error's `ctx` key `app.core.errors.problems.CHECKED`, where `validation_problem` reads them.

It runs inside the plan request's validator, so every body that nests a plan request (a
check's or a schedule's `/plan`) and the CLI, which validates without the web stack, get the
same checked suggestions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

from pydantic import ModelWrapValidatorHandler, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from app.core.errors.domain import DomainError
from app.core.errors.problems import CHECKED, nearest_bound
from app.core.planner import plan

MOST = 3  # suggestions per field, nearest first


class ToCore(Protocol):
    def to_core(self) -> Any: ...


Validate = Callable[[Any], ToCore]
Run = Callable[[Any], object]  # what the validated request is for: the planner, or another search


def with_checked_suggestions(
    data: Any, err: ValidationError, validate: Validate, run: Run = plan
) -> ValidationError:
    """`err` with the values that plan in each error's context (none where nothing does).

    Only a request with one field in error gets any: substituting one value cannot repair a
    request that is wrong in two places, and trying would cost a plan per error."""
    errors = err.errors(include_url=False)
    values: list[int] = []
    if isinstance(data, dict) and len({tuple(e["loc"]) for e in errors}) == 1:
        values = _working_values(data, errors[0], validate, run)
    details = [
        InitErrorDetails(
            # The same type and message as pydantic's; the context gains the checked values.
            type=PydanticCustomError(e["type"], e["msg"], {**e.get("ctx", {}), CHECKED: values}),
            loc=tuple(e["loc"]),
            input=e["input"],
        )
        for e in errors
    ]
    return ValidationError.from_exception_data(err.title, details)


def checked_suggestions_validator(run: Run) -> Any:
    """A model's wrap validator that, on a schema error, gives only the values with which
    `run` (the search the request is for) succeeds; a valid body pays one function call."""

    def checked(cls: type[ToCore], data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        try:
            return handler(data)
        except ValidationError as err:
            raise with_checked_suggestions(data, err, handler, run) from None

    return model_validator(mode="wrap")(classmethod(checked))  # type: ignore[arg-type]


def _working_values(data: dict[str, Any], error: Any, validate: Validate, run: Run) -> list[int]:
    candidates = _candidates(error)
    located = _locate(data, error["loc"])
    if located is None:
        return []
    key = _key(data, error["loc"])  # the planner names the field so (app.core.errors.domain.field_key)
    working: list[int] = []
    tried: set[int] = set()
    while candidates and len(tried) < 4 * MOST:
        value = candidates.pop(0)
        if value in tried:
            continue
        tried.add(value)
        suggested = _plans_with(data, error["loc"], value, validate, key, run)
        if suggested is None:
            working.append(value)
        elif not working:
            candidates += [v for v in suggested if v not in tried]
    given = error.get("input")
    if isinstance(given, int) or (isinstance(given, float) and math.isfinite(given)):
        working.sort(key=lambda v: (abs(v - given), v))
    return working[:MOST]


def _candidates(error: Any) -> list[int]:
    out = []
    bound = nearest_bound(error)
    if bound is not None:
        out.append(bound)
    given = error.get("input")
    if isinstance(given, float) and math.isfinite(given) and not given.is_integer():
        out += [math.floor(given), math.ceil(given)]
    return out


def _locate(data: Any, loc: Any) -> tuple[Any, Any] | None:
    """The object (a dict, or a list such as the elastic body's micro-batch sizes) holding the
    error's value and its key or index. pydantic's loc also names the branch of a union
    ("int", "function-after[...]"): those parts are not in the data, passed over."""
    node, found = data, None
    for part in loc:
        within = isinstance(node, dict) and isinstance(part, str) and part in node
        within = within or (isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node))
        if within:
            found, node = (node, part), node[part]
    return found


def _path(data: Any, loc: Any) -> list[str | int]:
    """The loc's parts that are in the data: the keys and indexes down to the error's value."""
    node, parts = data, []
    for part in loc:
        keyed = isinstance(node, dict) and isinstance(part, str) and part in node
        if keyed or (isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)):
            parts.append(part)
            node = node[part]
    return parts


def _key(data: Any, loc: Any) -> str:
    """The dotted path of the loc's parts that are in the data."""
    return ".".join(map(str, _path(data, loc)))


def _replaced(data: Any, path: list[str | int], value: int) -> Any:
    """`data` with `value` at `path`: only the objects on the path are copied, the rest shared
    (validation reads the request, never changes it). A deep copy of a 10,000-node-group body
    cost more than validating it (issue 40). None where the path is empty."""
    if not path:
        return None
    head, rest = path[0], path[1:]
    changed = dict(data) if isinstance(data, dict) else list(data)
    changed[head] = _replaced(data[head], rest, value) if rest else value  # type: ignore[index]
    return changed


def _plans_with(
    data: dict[str, Any], loc: Any, value: int, validate: Validate, key: str, run: Run
) -> list[int] | None:
    """None when the request plans with `value` in place; else the planner's own suggestions
    for the field (empty when it has none or the request does not validate)."""
    changed = _replaced(data, _path(data, loc), value)
    if changed is None:
        return []
    try:
        run(validate(changed).to_core())
    except ValidationError:
        return []
    except DomainError as err:
        return list(err.suggestions.get(key, []))
    return None
