"""The core's records (app.core.records.record.record) keep what `dataclass(frozen=True, slots=True)`
gave them: every field is read-only to mypy, which CI runs; equal records hash alike, by their
fields, as a frozen dataclass's do; they copy, pickle and `replace` as before."""

from __future__ import annotations

import dataclasses
import importlib
import os
import pickle
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import app.core
from app.core.planner import plan
from app.core.records.plan_request import LearningRateSpec
from app.schemas.examples import plan_example
from app.schemas.plan_requests import PlanRequestIn

ROOT = Path(__file__).resolve().parents[2]
_NO_CONFIG = ("--cache-dir", os.devnull, "--config-file", os.devnull)  # the snippet alone, as mypy sees it


def _records() -> list[type[Any]]:
    """Every record the core defines: a slotted dataclass whose hash comes from its fields."""
    found = []
    for info in pkgutil.walk_packages(app.core.__path__, "app.core."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and value.__module__ == info.name
                and dataclasses.is_dataclass(value)
                and value.__dataclass_params__.unsafe_hash  # type: ignore[attr-defined]
            ):
                found.append(value)
    return found


def test_the_core_declares_its_value_types_as_records() -> None:
    names = {cls.__name__ for cls in _records()}
    assert {"PlanRequest", "Plan", "NodeGroup", "Topology", "ReplicaGroup", "Segment", "Share"} <= names
    assert len(names) >= 35
    for cls in _records():
        assert "__slots__" in vars(cls) and "__dict__" not in dir(cls), cls


def test_mypy_rejects_an_assignment_to_any_field_of_any_record(tmp_path: Path) -> None:
    """One assignment per record, each of its first field: mypy must refuse every one."""
    records = _records()
    lines = ["from typing import Any", *{f"import {cls.__module__}" for cls in records}, ""]
    for i, cls in enumerate(records):
        field = dataclasses.fields(cls)[0].name
        lines += [f"def touch{i}(x: {cls.__module__}.{cls.__qualname__}, v: Any) -> None:"]
        lines += [f"    x.{field} = v"]
    lines += ["", "def fine(x: app.core.records.plan_request.NodeGroup) -> object:"]
    lines += ["    import dataclasses", "    return dataclasses.replace(x, num_nodes=2)"]
    snippet = tmp_path / "assign.py"
    snippet.write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--strict", *_NO_CONFIG, str(snippet)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "MYPYPATH": str(ROOT)},
        check=False,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert len(errors) == len(records), done.stdout + done.stderr
    assert all("is read-only" in line for line in errors), done.stdout


def _parts(value: Any) -> list[Any]:
    """`value` and every record inside it."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = [value]
        for field in dataclasses.fields(value):
            out += _parts(getattr(value, field.name))
        return out
    if isinstance(value, (tuple, list)):
        return [part for item in value for part in _parts(item)]
    return []


def _plans() -> list[Any]:
    out = []
    for name in ("dataset_and_lr", "mixed"):
        request = PlanRequestIn.model_validate(plan_example(name)).to_core()
        out += [request, plan(request)]
    return out


def test_records_hash_compare_copy_and_pickle_as_frozen_dataclasses_do() -> None:
    seen = set()
    for whole in _plans():
        for part in _parts(whole):
            seen.add(type(part).__name__)
            values = tuple(getattr(part, f.name) for f in dataclasses.fields(part) if f.compare)
            twin = dataclasses.replace(part)
            assert twin == part and twin is not part
            try:
                expected = hash(values)
            except TypeError:  # a field that is a list or dict: unhashable, as when frozen
                continue
            assert hash(part) == hash(twin) == expected
            assert {part: 1}[twin] == 1
            assert pickle.loads(pickle.dumps(part)) == part
    assert {"Plan", "PlanRequest", "LearningRatePlan", "ReplicaGroup", "SamplerPlan"} <= seen


def test_a_record_differs_from_one_with_another_field_value() -> None:
    spec = LearningRateSpec(base_lr=0.1)
    other = dataclasses.replace(spec, base_lr=0.2)
    assert other != spec and hash(other) != hash(spec)
    assert spec == LearningRateSpec(base_lr=0.1) and hash(spec) == hash(LearningRateSpec(base_lr=0.1))
