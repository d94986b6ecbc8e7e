"""A field the schema does not know gets "did you mean `global_batch_size`?".

pydantic says only "Extra inputs are not permitted" for `global_batch` or `gpu_per_node`. The
model that refused the field knows the names it would have taken, at any depth (topology,
node groups, dataset, learning rate, parallelism, a check's options, a schedule's ramp-up):
the error's location is walked down the request model to that level, and the field meant is
added to the message: another tool's name for it (`base_learning_rate`, `nproc_per_node`, `tp`:
SYNONYMS), else the nearest known name, else the same field one or two levels down, dotted
(`num_nodes` beside `topology`: `topology.num_nodes`).

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


# Other tools' names (DeepSpeed, Megatron, torchrun, HF Trainer) and plain words for a field.
SYNONYMS = {
    "base_learning_rate": "base_lr",
    "learning_rate": "base_lr",
    "lr": "base_lr",
    "train_batch_size": "global_batch_size",
    "train_micro_batch_size_per_gpu": "micro_batch_size",
    "per_device_train_batch_size": "micro_batch_size",
    "accumulation_steps": "gradient_accumulation_steps",
    "grad_accum_steps": "gradient_accumulation_steps",
    "gpus": "gpus_per_node",
    "nproc_per_node": "gpus_per_node",
    "nodes": "num_nodes",
    "nnodes": "num_nodes",
    "tp": "tensor",
    "tensor_parallel_size": "tensor",
    "tensor_model_parallel_size": "tensor",
    "pp": "pipeline",
    "pipeline_parallel_size": "pipeline",
    "pipeline_model_parallel_size": "pipeline",
    "cp": "context",
    "context_parallel_size": "context",
    "dp_shard": "data_parallel_shard",
    "ep": "expert",
    "num_epochs": "epochs",
    "num_train_epochs": "epochs",
    "num_warmup_steps": "warmup_steps",
    "seq_len": "sequence_length",
    "max_seq_length": "sequence_length",
    "optim": "optimizer",
    "gradient_clipping": "max_grad_norm",
    "max_norm": "max_grad_norm",
    "throughput": "relative_throughput",
}
_DEPTH = 2  # levels below the refusing model searched for a field sent outside its object


def _models_at(annotation: Any, path: Iterable[Any]) -> list[type[BaseModel]]:
    """The models at `path` (a pydantic error location, without the field itself)."""
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
    return _models(annotation)


def known_names(annotation: Any, path: Iterable[Any]) -> list[str]:
    """The field names the model at `path` (a pydantic error location, without the field
    itself) accepts; empty where the path leads to no model."""
    return [name for model in _models_at(annotation, path) for name in _names(model)]


def nearest_name(name: str, known: list[str]) -> str | None:
    near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return near[0] if near else None


def _below(models: list[type[BaseModel]], name: str, depth: int = _DEPTH) -> str | None:
    """`name` (or its synonym) as a field of an object inside `models`, dotted from here; the
    shallowest first."""
    children = [
        (field.alias or key, _models(field.annotation))
        for model in models
        for key, field in model.model_fields.items()
    ]
    for wanted in (name, SYNONYMS.get(name)):
        for key, inner in children:
            if wanted is not None and wanted in {n for m in inner for n in _names(m)}:
                return f"{key}.{wanted}"
    if depth > 1:
        for key, inner in children:
            deeper = _below(inner, name, depth - 1) if inner else None
            if deeper is not None:
                return f"{key}.{deeper}"
    return None


def field_meant(name: str, annotation: Any, path: Iterable[Any]) -> str | None:
    """The field an unknown `name` at `path` most likely meant: another tool's name for a field
    here, the same field one or two levels down (dotted), else the nearest name here."""
    models = _models_at(annotation, path)
    known = [n for model in models for n in _names(model)]
    if SYNONYMS.get(name) in known:
        return SYNONYMS[name]
    below = _below(models, name)
    exact_below = below is not None and below.endswith(f".{name}")
    return (below if exact_below else None) or nearest_name(name, known) or below


def with_field_hints(errors: Iterable[Mapping[str, Any]], models: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`errors` (pydantic's, located from FastAPI's "body"/"query") with a "did you mean"
    added to each unknown field that is close to a known one. `models` maps the location's
    first part to the model validated there. A misspelt required field also shows as missing:
    the misspelling is listed first, since it says what to fix."""
    errors = _wrapped_plan(list(errors), models)
    out: list[dict[str, Any]] = []
    hinted: list[dict[str, Any]] = []
    for given in errors:
        err = dict(given)
        loc = tuple(err.get("loc", ()))
        if err.get("type") == EXTRA and len(loc) >= 2 and loc[0] in models and isinstance(loc[-1], str):
            near = field_meant(loc[-1], models[loc[0]], loc[1:-1])
            if near is not None:
                err["msg"] = f"{err.get('msg', 'Extra inputs are not permitted')}; did you mean `{near}`?"
                hinted.append(err)
        out.append(err)
    # The field meant also shows as missing, or its object as incomplete: the hint is listed
    # first, since it says what to fix.
    return hinted + [e for e in out if not any(e is h for h in hinted)]


WRAP = 'the body is a plan request: wrap it as {"plan": ...}'


def _wrapped_plan(errors: list[Mapping[str, Any]], models: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A bare plan posted where a plan is wrapped (a check, a schedule): one error at /plan that
    says to wrap it, in place of "Field required" there and an "Extra inputs" per plan field."""
    missing = [
        e
        for e in errors
        if e.get("type") == "missing" and len(e.get("loc", ())) == 2 and e["loc"][1] == "plan"
    ]
    if not missing or not isinstance(missing[0].get("input"), Mapping) or missing[0]["loc"][0] not in models:
        return errors
    where = missing[0]["loc"][0]
    plan_fields = set(known_names(models[where], ["plan"]))
    if "topology" not in missing[0]["input"] or "topology" not in plan_fields:
        return errors
    moved = {
        id(e)
        for e in errors
        if e.get("type") == EXTRA
        and tuple(e.get("loc", ()))[:1] == (where,)
        and len(e["loc"]) == 2
        and e["loc"][1] in plan_fields
    }
    wrap = {**missing[0], "msg": f"Field required: {WRAP}"}
    return [wrap if e is missing[0] else e for e in errors if id(e) not in moved]
