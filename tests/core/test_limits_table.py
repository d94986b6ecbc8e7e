"""The table of limits is the one place a bound is written: every bound the JSON Schema of the
plan and check requests states (the OpenAPI document's) is the table's, of the same type (`1e6`
stays a float, 10 an int), and every entry of the table is stated there; a numeric field
without bounds is named here as free. And the check of JSON that did not come through the
schema reads the same table as the schema would: a whole `2.0` is a count, `true` and `"2"`
are not, null only where the field takes it, the error at the field's pointer with the
nearest valid value."""

from __future__ import annotations

from typing import Any

import pytest

from app.contract.limits import CHECK_LIMITS
from app.core.errors.domain import InvalidValue
from app.core.records.plan_request import MAX_SAFE_INTEGER
from app.core.request.bounds import Bounds, Limits
from app.core.request.limits import PLAN_LIMITS

_KEYWORDS = {
    "ge": "minimum",
    "gt": "exclusiveMinimum",
    "le": "maximum",
    "lt": "exclusiveMaximum",
}
_TYPES = {"int": "integer", "float": "number", "items": "array"}
# Numbers the plan request takes without bounds: an lr-scaling probe's answer passed back
# whole, which the plan does not read (its curves and noise scale are for people and charts).
FREE = {
    "learning_rate.lr_scaling.base.curve[].samples",
    "learning_rate.lr_scaling.base.curve[].loss",
    "learning_rate.lr_scaling.rules[].curve[].samples",
    "learning_rate.lr_scaling.rules[].curve[].loss",
    "learning_rate.lr_scaling.noise_scale.start",
    "learning_rate.lr_scaling.noise_scale.end",
}


def _schemas(model: str) -> dict[str, Any]:
    """The request model's JSON Schema, its parts by name: what the OpenAPI document holds,
    before FastAPI writes every bound of a body as a float (`"maximum":10000000.0`)."""
    from pydantic import BaseModel

    from app.schemas.checks import CheckRequestIn
    from app.schemas.plan_requests import PlanRequestIn

    models: dict[str, type[BaseModel]] = {"PlanRequestIn": PlanRequestIn, "CheckRequestIn": CheckRequestIn}
    schema = models[model].model_json_schema()
    return {**schema.pop("$defs"), model: schema}


class _Walk:
    """Each numeric field and list of a request schema, by path: its JSON Schema (the branch
    that is not null) and whether null is valid."""

    def __init__(self, schemas: dict[str, Any]) -> None:
        self.schemas = schemas
        self.found: dict[str, tuple[dict[str, Any], bool]] = {}

    def walk(self, schema: dict[str, Any], path: str, nullable: bool = False) -> None:
        if "$ref" in schema:
            return self.walk(self.schemas[schema["$ref"].rsplit("/", 1)[1]], path, nullable)
        branches = schema.get("anyOf", [])
        if branches:
            null = {"type": "null"} in branches
            for branch in branches:
                if branch != {"type": "null"}:
                    self.walk(branch, path, null)
            return None
        kind = schema.get("type")
        if kind in ("integer", "number") or (kind == "array" and {"minItems", "maxItems"} & set(schema)):
            seen = self.found.setdefault(path, (schema, nullable))
            assert seen == (schema, nullable), f"{path} differs between its places"
        for item in [schema.get("items"), *schema.get("prefixItems", [])]:
            if item:
                self.walk(item, path + "[]")
        for name, field in schema.get("properties", {}).items():
            self.walk(field, f"{path}.{name}" if path else name)
        return None


def _stated(bounds: Bounds) -> dict[str, Any]:
    """The JSON Schema keywords a field with these bounds has in the OpenAPI document."""
    keywords = {"minItems": "ge", "maxItems": "le"} if bounds.kind == "items" else None
    out: dict[str, Any] = {"type": _TYPES[bounds.kind]}
    if keywords:
        out |= {key: getattr(bounds, b) for key, b in keywords.items() if getattr(bounds, b) is not None}
    else:
        out |= {_KEYWORDS[b]: getattr(bounds, b) for b in _KEYWORDS if getattr(bounds, b) is not None}
    return out


_BOUND_KEYS = {"type", "minItems", "maxItems", *_KEYWORDS.values()}


@pytest.mark.parametrize(
    ("model", "table"), [("PlanRequestIn", PLAN_LIMITS), ("CheckRequestIn", CHECK_LIMITS)]
)
def test_every_bound_of_the_schema_is_the_tables(model: str, table: Limits) -> None:
    schemas = _schemas(model)
    walk = _Walk(schemas)
    walk.walk(schemas[model], "")
    bounded = {p: v for p, v in walk.found.items() if set(v[0]) & (_BOUND_KEYS - {"type"})}
    free = {p.removeprefix("plan.") for p, v in walk.found.items() if p not in bounded}
    assert free == FREE, "a number without bounds: give it an entry in the table of limits"
    assert set(bounded) == set(table), "the schema's bounded fields and the table's paths differ"
    for path, (schema, nullable) in bounded.items():
        stated = {k: v for k, v in schema.items() if k in _BOUND_KEYS}
        expected = _stated(table[path])
        assert stated == expected, path
        # The same number is not enough: 10 and 10.0 are written differently in the document.
        assert [type(v) for v in stated.values()] == [type(expected[k]) for k in stated], path
        assert nullable == table[path].allow_null, path


def test_a_count_given_as_a_whole_float_comes_back_an_int_and_a_float_field_a_float() -> None:
    body: dict[str, Any] = {
        "topology": {"num_nodes": 2.0, "gpus_per_node": 8},
        "global_batch_size": 16,
        "learning_rate": {"base_lr": 1, "betas": [0, 0.5]},
        "dataset": None,
    }
    checked = PLAN_LIMITS.check(body)
    assert checked == {**body, "topology": {"num_nodes": 2, "gpus_per_node": 8}}
    assert type(checked["topology"]["num_nodes"]) is int
    assert type(checked["learning_rate"]["base_lr"]) is float
    assert checked["learning_rate"]["betas"] == [0.0, 0.5] and body["topology"]["num_nodes"] == 2.0
    plain = {"topology": {"num_nodes": 2, "gpus_per_node": 8}, "global_batch_size": 16}
    assert PLAN_LIMITS.check(plain) is plain  # nothing to change: not copied


@pytest.mark.parametrize(
    ("body", "pointer", "suggested"),
    [
        ({"parallelism": {"tensor": 10_000_001}}, "/parallelism/tensor", 10_000_000),
        ({"dataset": {"num_samples": 8, "epochs": 0}}, "/dataset/epochs", 1),
        (
            {"learning_rate": {"base_lr": 0.1, "warmup_epochs": 1e6 + 1}},
            "/learning_rate/warmup_epochs",
            1_000_000,
        ),
        ({"learning_rate": {"base_lr": 0}}, "/learning_rate/base_lr", None),
        ({"learning_rate": {"base_lr": 0.1, "gamma": None}}, "/learning_rate/gamma", None),
        ({"learning_rate": {"base_lr": 0.1, "betas": [0.9]}}, "/learning_rate/betas/1", None),
        ({"learning_rate": {"base_lr": 0.1, "betas": [0.9, 0.9, 0.9]}}, "/learning_rate/betas", None),
        ({"global_batch_size": MAX_SAFE_INTEGER + 1}, "/global_batch_size", MAX_SAFE_INTEGER),
        ({"global_batch_size": True}, "/global_batch_size", None),
        ({"global_batch_size": "16"}, "/global_batch_size", None),
        ({"global_batch_size": 2.5}, "/global_batch_size", None),
        ({"gradient_noise_scale": float("inf")}, "/gradient_noise_scale", None),
        (
            {"topology": {"node_groups": [{"num_nodes": 1, "gpus_per_node": 0}]}},
            "/topology/node_groups/0/gpus_per_node",
            1,
        ),
        (
            {"topology": {"throughput_curve": [{"micro_batch_size": 1, "samples_per_s": 5e-324}]}},
            "/topology/throughput_curve/0/samples_per_s",
            None,
        ),
        ({"topology": "two nodes"}, "/topology", None),
    ],
)
def test_a_value_outside_is_refused_at_its_pointer(
    body: dict[str, Any], pointer: str, suggested: int | None
) -> None:
    with pytest.raises(InvalidValue) as refused:
        PLAN_LIMITS.check(body)
    assert refused.value.pointer == pointer
    key = pointer.strip("/").replace("/", ".")
    assert refused.value.suggestions == ({key: [suggested]} if suggested is not None else {})
    assert pointer.rsplit("/", 1)[1] in refused.value.detail


def test_the_check_tables_plan_is_the_plans_under_plan() -> None:
    for path, bounds in PLAN_LIMITS.items():
        assert CHECK_LIMITS[f"plan.{path}"] is bounds
    with pytest.raises(InvalidValue) as refused:
        CHECK_LIMITS.check({"plan": {"parallelism": {"expert": 0}}, "steps": 1})
    assert refused.value.pointer == "/plan/parallelism/expert"
    assert refused.value.suggestions == {"parallelism.expert": [1]}
