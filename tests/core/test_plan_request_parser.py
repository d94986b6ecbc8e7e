"""One reading of a plan request's JSON: the core parser on the raw body (as the rank program
uses it) and the HTTP schema's `to_core()` (pydantic first) build the same PlanRequest, and so
the same plan."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.core.planner import plan
from app.core.records.plan_request import PlanRequest, Topology
from app.core.request.parse import plan_request, request_json
from app.schemas.examples import PLAN_EXAMPLES
from app.schemas.plan_requests import PlanRequestIn
from app.schemas.plan_responses import plan_json

BODIES: dict[str, dict[str, Any]] = {
    **{f"example_{name}": example["value"] for name, example in PLAN_EXAMPLES.items()},
    "every_learning_rate_field": {
        "topology": {"num_nodes": 2, "gpus_per_node": 8},
        "global_batch_size": 1024,
        "dataset": {"num_samples": 50000, "epochs": 3},
        "learning_rate": {
            "base_lr": 1,  # a JSON integer where the core holds a float
            "base_batch_size": 128,
            "rule": "sqrt",
            "optimizer": "adam",
            "warmup_epochs": 1,
            "betas": [0.8, 0.99],
            "eps": 1e-6,
        },
    },
    "warmup_steps_and_noise_scale": {
        "topology": {"num_nodes": 1, "gpus_per_node": 4},
        "micro_batch_size": 8,
        "gradient_accumulation_steps": 4,
        "learning_rate": {"base_lr": 0.001, "optimizer": "lamb", "warmup_steps": 100},
        "gradient_noise_scale": 2000,
        "gradient_noise_scale_stderr": 0,
    },
    "noise_scale_alone": {
        "topology": {"num_nodes": 2, "gpus_per_node": 8},
        "global_batch_size": 4096,
        "gradient_noise_scale": 512.5,
    },
    "unnamed_groups_and_every_option": {
        "topology": {
            "node_groups": [
                {"num_nodes": 1, "gpus_per_node": 4, "relative_throughput": 3},
                {"num_nodes": 2, "gpus_per_node": 2, "max_micro_batch_size": 16},
            ]
        },
        "global_batch_size": 1000,
        "max_micro_batch_size": 32,
        "divisibility": "balance",
        "loss_reduction": "sum",
        "dataset": {"num_samples": 12345, "shuffle": False, "seed": 3, "drop_last": True},
        "learning_rate": {"base_lr": 0.1, "rule": "none"},
    },
    "parallelism": {
        "topology": {"num_nodes": 4, "gpus_per_node": 8},
        "parallelism": {"tensor": 2, "pipeline": 2, "context": 2},
        "global_batch_size": 64,
        "divisibility": "round_up",
    },
    # Every top-level field away from its default.
    "every_field": {
        "topology": {"node_groups": [{"name": "a", "num_nodes": 2, "gpus_per_node": 8}]},
        "global_batch_size": 64,
        "micro_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "max_micro_batch_size": 8,
        "divisibility": "balance",
        "parallelism": {"tensor": 2},
        "loss_reduction": "sum",
        "dataset": {"num_samples": 1000},
        "learning_rate": {"base_lr": 0.1},
        "gradient_noise_scale": 100,
        "gradient_noise_scale_stderr": 10,
    },
    # The token fields replace the batch fields above, so they have a body of their own.
    "every_token_field": {
        "topology": {"num_nodes": 1, "gpus_per_node": 4},
        "sequence_length": 128,
        "global_batch_tokens": 4096,
        "micro_batch_tokens": 512,
        "loss_normalization": "token",
        "packing": {
            "mode": "token_budget",
            "max_tokens_per_micro_batch": 256,
            "document_length": {"mean": 60, "max": 128},
        },
        "learning_rate": {"base_lr": 0.1, "base_batch_tokens": 1024},
        "dataset": {"num_samples": 320, "epochs": 2},
        "resume": {"optimizer_step": 13, "data_parallel_size": 2},
        "recommend": {
            "law": "deepseek",
            "train_tokens": 1000000,
            "architecture": {
                "layers": 2,
                "hidden_size": 64,
                "ffn_hidden_size": 172,
                "num_heads": 4,
                "num_kv_heads": 2,
                "vocab_size": 1000,
                "gated_ffn": False,
            },
            "measured_noise_scale": 8,
        },
    },
}


@pytest.mark.parametrize("body", BODIES.values(), ids=BODIES.keys())
def test_the_core_parser_and_the_schema_build_the_same_request_and_plan(body: dict[str, Any]) -> None:
    parsed = plan_request(body)
    validated = PlanRequestIn.model_validate(body).to_core()
    assert parsed == validated
    assert plan_json(plan(parsed)) == plan_json(plan(validated))


def test_no_field_is_dropped() -> None:
    """Every field of the HTTP schema reaches the core (the rank program's own parser once
    dropped the learning rate and the noise scale)."""
    request = plan_request(BODIES["every_field"])
    tokens = plan_request(BODIES["every_token_field"])
    defaults = PlanRequest(topology=Topology.homogeneous(1, 1))
    for name in PlanRequestIn.model_fields:
        assert getattr(request, name) != getattr(defaults, name) or (
            getattr(tokens, name) != getattr(defaults, name)
        ), name
    assert tokens.learning_rate is not None and tokens.learning_rate.base_batch_tokens == 1024
    assert plan(request).efficiency is not None


def test_json_numbers_become_the_core_types() -> None:
    request = plan_request(BODIES["warmup_steps_and_noise_scale"])
    assert request.learning_rate is not None and request.learning_rate.warmup_steps == 100
    assert (request.gradient_noise_scale, request.gradient_noise_scale_stderr) == (2000.0, 0.0)
    assert isinstance(request.gradient_noise_scale, float)
    rate = plan_request(BODIES["every_learning_rate_field"]).learning_rate
    assert rate is not None and rate.betas == (0.8, 0.99) and isinstance(rate.base_lr, float)


@pytest.mark.parametrize("body", BODIES.values(), ids=BODIES.keys())
def test_request_json_writes_back_the_request_the_parser_read(body: dict[str, Any]) -> None:
    """A micro-batch search answers with the re-planned request as JSON (request_json): sent
    again, it is the same request."""
    request = plan_request(body)
    written = request_json(request)
    assert plan_request(json.loads(json.dumps(written))) == request
    assert PlanRequestIn.model_validate(written).to_core() == request
