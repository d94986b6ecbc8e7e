"""A field the schema does not know gets "did you mean `global_batch_size`?".

pydantic says only "Extra inputs are not permitted" for `global_batch` or `gpu_per_node`. The
model that refused the field knows the names it would have taken, at any depth (topology,
node groups, dataset, learning rate, parallelism, a check's options, a schedule's ramp-up):
the error's location is walked down the request model to that level, and the nearest known
name is added to the message.

Done when an error is reported, not in a validator: a valid request pays nothing for it.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

EXTRA = "extra_forbidden"


def _branches(annotation: Any) -> list[Any]:
    """The types a value of `annotation` may have: Annotated and unions unwrapped."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _branches(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return [b for arg in typing.get_args(annotation) for b in _branches(arg)]
    return [annotation]


def _models(annotation: Any) -> list[type[BaseModel]]:
    return [b for b in _branches(annotation) if isinstance(b, type) and issubclass(b, BaseModel)]


def _names(model: type[BaseModel]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


def known_names(annotation: Any, path: Iterable[Any]) -> list[str]:
    """The field names the model at `path` (a pydantic error location, without the field
    itself) accepts; empty where the path leads to no model."""
    for part in path:
        if isinstance(part, int):
            items = [
                typing.get_args(b)[0]
                for b in _branches(annotation)
                if typing.get_origin(b) in (list, tuple) and typing.get_args(b)
            ]
            if items:
                annotation = items[0]
            continue
        fields = [m.model_fields.get(part) for m in _models(annotation)]
        found = [f for f in fields if f is not None]
        # A part that names no field is a union branch pydantic put in the location: passed over.
        if found:
            annotation = found[0].annotation
    return [name for model in _models(annotation) for name in _names(model)]


def nearest_name(name: str, known: list[str]) -> str | None:
    near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return near[0] if near else None


def with_field_hints(errors: Iterable[Mapping[str, Any]], models: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`errors` (pydantic's, located from FastAPI's "body"/"query") with a "did you mean"
    added to each unknown field that is close to a known one. `models` maps the location's
    first part to the model validated there. A misspelt required field also shows as missing:
    the misspelling is listed first, since it says what to fix."""
    out: list[dict[str, Any]] = []
    hinted: dict[tuple[Any, ...], dict[str, Any]] = {}  # location of the field meant -> its error
    for given in errors:
        err = dict(given)
        loc = tuple(err.get("loc", ()))
        if err.get("type") == EXTRA and len(loc) >= 2 and loc[0] in models and isinstance(loc[-1], str):
            near = nearest_name(loc[-1], known_names(models[loc[0]], loc[1:-1]))
            if near is not None:
                err["msg"] = f"{err.get('msg', 'Extra inputs are not permitted')}; did you mean `{near}`?"
                hinted[(*loc[:-1], near)] = err
        out.append(err)
    for meant, extra in hinted.items():
        missing = [
            i for i, e in enumerate(out) if e.get("type") == "missing" and tuple(e.get("loc", ())) == meant
        ]
        if missing and out.index(extra) > missing[0]:
            out.remove(extra)
            out.insert(missing[0], extra)
    return out
