"""The result a rank writes is the result the HTTP API documents: every key of a real check's
the codec's JSON of a CheckResult (with a noise-scale measurement and a micro-batch search, so that
every section is filled) is a field of the OpenAPI models, none is left over, and the result
survives the trips it makes between processes (the job store, the TCPStore and the pipe:
the codec) unchanged, and the served model would serve it as it is stored: GET serves the
stored JSON without validating it again.

The checks run in this process, on a real gloo process group of one process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")

from pydantic import BaseModel
from support.one_rank import one_rank_group

from app.contract import protocol
from app.contract.check_result import CheckResult
from app.contract.codec import decode, encode
from app.contract.request import build_spec, check_request
from app.schemas.check_results import (
    CheckResultOut,
    MicroBatchSearchOut,
    NoiseEfficiencyOut,
    NoiseScaleOut,
    NoiseStepOut,
    ReplannedSplitOut,
    SearchedSplitOut,
    TrialOut,
)
from app.schemas.kinds.run import ControlStepOut, EpochEndOut, TrajectoryStepOut
from app.worker.checks.driver import run_spec
from app.worker.checks.result_parts import CheckGroup
from app.worker.training.workload import load

pytestmark = pytest.mark.slow

FOUR = {"topology": {"num_nodes": 1, "gpus_per_node": 4}, "global_batch_size": 128}
MODELS = {"quadratic": "app.worker.example_models:quadratic", "mlp": "app.worker.example_models:mlp"}


@pytest.fixture(scope="module")
def group() -> Iterator[CheckGroup]:
    with one_rank_group() as group:
        yield group


def checked(group: CheckGroup, body: dict[str, Any]) -> dict[str, Any]:
    spec = build_spec(check_request(body))
    workload = load(spec.model, MODELS.get(spec.model), spec.seed)
    result = run_spec(spec, group, workload, MODELS.get(spec.model))
    assert result is not None
    return dict(encode(result))


def keys(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


@pytest.fixture(scope="module")
def measured(group: CheckGroup) -> dict[str, Any]:
    """quadratic's noise scale is known and measured reliably: its efficiency is filled."""
    return checked(group, {"plan": FOUR, "model": "quadratic", "noise_scale": {"steps": 32}})


@pytest.fixture(scope="module")
def searched(group: CheckGroup) -> dict[str, Any]:
    fit = {"memory_bytes": 1 << 30, "optimizer": "adamw"}
    return checked(group, {"plan": FOUR, "model": "mlp", "fit_micro_batch": fit, "noise_scale": {"steps": 0}})


@pytest.fixture(scope="module")
def trained(group: CheckGroup) -> dict[str, Any]:
    """A run of several steps, with its run-level controls: its trajectory keys are filled."""
    recipe = {"base_lr": 0.1, "rule": "none", "warmup_steps": 2, "warmup_start_lr": 0.0, "max_grad_norm": 0.5}
    return checked(group, {"plan": {**FOUR, "micro_batch_size": 16, "learning_rate": recipe}, "steps": 4})


def test_every_key_of_a_result_is_documented_and_none_is_left_over(
    measured: dict[str, Any], searched: dict[str, Any], trained: dict[str, Any]
) -> None:
    for result in (measured, searched, trained):
        assert set(result) == keys(CheckResultOut)
    assert trained["steps"] == 4 and measured["steps"] == 1 and measured["trajectory"] is None
    assert all(set(step) == keys(TrajectoryStepOut) for step in trained["trajectory"])
    assert set(trained["epoch_end"]) == keys(EpochEndOut)
    assert trained["control_trajectories"]
    for steps in trained["control_trajectories"].values():
        assert all(set(step) == keys(ControlStepOut) for step in steps)
    noise = measured["noise_scale"]
    assert set(noise) == keys(NoiseScaleOut)
    assert noise["reliable"], noise  # else there is no efficiency to hold against its model
    assert set(noise["efficiency"]) == keys(NoiseEfficiencyOut)
    assert all(set(step) == keys(NoiseStepOut) for step in noise["history"])
    search = searched["micro_batch_search"]
    assert set(search) == keys(MicroBatchSearchOut)
    assert search["optimizer"] == "adamw"  # the probe's optimizer the schema now offers
    assert search["trials"] and all(set(t) == keys(TrialOut) for t in search["trials"])
    assert set(search["requested"]) == keys(SearchedSplitOut)
    assert set(search["planned"]) == keys(ReplannedSplitOut)


def test_a_result_crosses_processes_and_the_api_unchanged(
    measured: dict[str, Any], searched: dict[str, Any], trained: dict[str, Any]
) -> None:
    for result in (measured, searched, trained):
        wire = json.loads(json.dumps(result))  # as the TCPStore and the job store hold it
        typed = decode(CheckResult, wire)
        assert encode(typed) == result
        message = protocol.Result(typed)
        assert protocol.from_pipe(protocol.to_pipe(message)) == message  # bytes on the pipe
        assert CheckResultOut.model_validate(wire).model_dump(mode="json") == wire
