"""A check kind joins each shared record by one line: every kind's part (the registry that
build_spec runs) reads a field of CheckOptions, the HTTP request has exactly CheckOptions'
fields beside its plan, and an HTTP request and the same JSON read by `check_request` (the
rank program's, the local CLI's) give the same request and the same spec."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from app.contract.kinds.registry import REQUEST_PARTS
from app.contract.request import CheckOptions, build_spec, check_request
from app.schemas.check_examples import CHECK_EXAMPLES
from app.schemas.checks import CheckRequestIn

OPTIONS = [f.name for f in dataclasses.fields(CheckOptions)]


def test_every_part_reads_a_field_of_the_options_once() -> None:
    # "plan": a part the plan itself asks for (a stream's dataset), with no option of its own
    read = [part.option for part in REQUEST_PARTS if part.option != "plan"]
    assert len(set(read)) == len(read)
    assert set(read) <= set(OPTIONS)


def test_the_http_request_has_the_options_fields_in_their_order() -> None:
    assert [name for name in CheckRequestIn.model_fields if name != "plan"] == OPTIONS


EVERY_OPTION: dict[str, Any] = {
    "plan": {
        "topology": {"num_nodes": 1, "gpus_per_node": 4},
        "global_batch_size": 32,
        "micro_batch_size": 4,
        "dataset": {"num_samples": 320, "shuffle": True, "seed": 0},
    },
    "model": "synthetic",
    "noise_scale": {"steps": 0, "learning_rate": 0.0},
    "backend": "gloo",
    "dtype": "float32",
    "seed": 3,
    "timeout_s": 60,
    "rendezvous": {"endpoint": "node0.example:29400", "nnodes": 2, "run_id": "job-1"},
    "workload": "synthetic",
    "steps": 20,
    "resume": {"at_step": 7, "data_parallel_size": 2},
    "throughput": {"micro_batch_sizes": [1, 2, 4], "repeats": 3, "time_optimizer_step": True},
}
BODIES = {name: example["value"] for name, example in CHECK_EXAMPLES.items()} | {"every_option": EVERY_OPTION}


@pytest.mark.parametrize("body", BODIES.values(), ids=list(BODIES))
def test_http_and_json_read_a_request_alike(body: dict[str, Any]) -> None:
    over_http = CheckRequestIn.model_validate(body).to_core()
    assert over_http == check_request(body)
    assert build_spec(over_http) == build_spec(check_request(body))


def test_an_lr_scaling_probe_reads_alike() -> None:
    body = {
        "plan": {
            **EVERY_OPTION["plan"],
            "learning_rate": {"base_lr": 0.1, "base_batch_size": 8, "rule": "none"},
        },
        "lr_scaling": {"samples": 4096, "rules": ["sqrt", "linear"], "points": 4, "label_noise": 0.5},
    }
    over_http = CheckRequestIn.model_validate(body).to_core()
    assert over_http == check_request(body)
    spec = build_spec(over_http)
    assert spec.lr_scaling is not None and [run.rule for run in spec.lr_scaling.runs] == [
        "sqrt",
        "linear",
        "none",
    ]
