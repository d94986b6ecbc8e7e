"""Exports, checked by the tools that consume them: DeepSpeed's batch rule, Python's parser,
the refusals of uneven plans and their suggestions (the launch scripts:
test_exports_launchers.py; the YAML exports: test_exports_yaml.py)."""

from __future__ import annotations

import ast
import json
from typing import Any

import pytest
from export_helpers import EVEN, MIXED, PINNED, call_kwargs, export_input

from app.core.errors.domain import PlanError
from app.core.exports.parts.export_types import ExportUnsupported
from app.core.exports.registry import EXPORTERS, export
from app.core.records.plan_request import PlanRequest
from app.schemas.examples import PLAN_EXAMPLES as EXAMPLES
from app.schemas.plan_requests import PlanRequestIn


def _request(body: dict[str, Any]) -> PlanRequest:
    return PlanRequestIn.model_validate(body).to_core()


UNEVEN_FORMATS = ["deepspeed", "accelerate", "hf-trainer", "lightning"]


# ----------------------------------------------------------------------------- DeepSpeed


def _deepspeed_batch_assertion(config: dict[str, Any], dp_world_size: int) -> None:
    """DeepSpeed's own rule (runtime/config.py `_batch_assertion`): the three numbers are
    positive and train_batch_size == micro x accumulation x data-parallel world size."""
    train, micro, accum = (
        config["train_batch_size"],
        config["train_micro_batch_size_per_gpu"],
        config["gradient_accumulation_steps"],
    )
    assert train > 0 and micro > 0 and accum > 0
    assert train == micro * accum * dp_world_size


@pytest.mark.parametrize("name", sorted(EVEN))
def test_deepspeed_config_satisfies_deepspeed_batch_rule(name: str) -> None:
    x = export_input(EVEN[name])
    out = export("deepspeed", x)
    assert out.media_type == "application/json"
    config = json.loads(out.text)
    # DeepSpeed's "world size" here is the data-parallel size, not the GPU count.
    _deepspeed_batch_assertion(config, x.plan.data_parallel_size)
    assert config["train_batch_size"] == x.plan.global_batch_size


def test_deepspeed_scheduler_warms_up_from_the_plans_start_lr_to_its_lr() -> None:
    x = export_input(EXAMPLES["dataset_and_lr"]["value"])
    config = json.loads(export("deepspeed", x).text)
    lr = x.plan.learning_rate
    assert lr is not None and x.plan.sampler is not None
    # The plan's momentum (DeepSpeed's SGD would otherwise run with none), and step 0's lr:
    # DeepSpeed steps its scheduler only after an optimizer step.
    params = {"lr": lr.warmup_start_lr, "momentum": 0.9, "nesterov": False, "weight_decay": 0.0}
    assert config["optimizer"] == {"type": "SGD", "params": params}
    assert config["gradient_clipping"] == 0.0  # stated also when off
    sched = config["scheduler"]
    # Warmup, then constant: the plan's decay (WarmupDecayLR would decay to 0 over the run).
    assert sched["type"] == "WarmupLR"
    assert sched["params"] == {
        "warmup_min_lr": lr.warmup_start_lr,
        "warmup_max_lr": lr.lr,
        "warmup_num_steps": lr.warmup_steps,
        "warmup_type": "linear",  # DeepSpeed's default is "log"
        "last_batch_iteration": 0,  # step 0 is done when DeepSpeed first steps it
    }


def test_deepspeed_adam_carries_the_sqrt_rules_betas() -> None:
    x = export_input(EXAMPLES["megatron"]["value"])
    config = json.loads(export("deepspeed", x).text)
    adam = x.plan.learning_rate.adam  # type: ignore[union-attr]
    assert adam is not None
    assert config["optimizer"]["type"] == "AdamW"
    assert config["optimizer"]["params"]["betas"] == [adam.beta1, adam.beta2]
    assert config["scheduler"]["type"] == "WarmupLR"  # no dataset: no run length to decay over


# ----------------------------------------------------------------------------- uneven plans


# Uneven plans: one with a micro-batch that evens it alone, two that need the global batch and
# the micro-batch changed together, and a balanced homogeneous one whose global batch alone does.
UNEVEN = {
    "mixed": MIXED,
    "mixed_1001": {**MIXED, "global_batch_size": 1001},
    "pinned": PINNED,
    "balanced": {
        "topology": {"num_nodes": 2, "gpus_per_node": 8},
        "global_batch_size": 1000,
        "divisibility": "balance",
    },
    # Split by measured throughput curves (issue 38): refused alike, suggestions that export.
    "mixed_curves": EXAMPLES["mixed_curves"]["value"],
}
# Formats that also need one node shape refuse MIXED (8- and 4-GPU nodes) whatever the batch.
NEEDS_ONE_SHAPE = {"accelerate", "lightning"}


def _exports(fmt: str, body: dict[str, Any]) -> bool:
    try:
        export(fmt, export_input(body))
    except PlanError:  # the planner's refusal, or the format's
        return False
    return True


@pytest.mark.parametrize("fmt", UNEVEN_FORMATS)
@pytest.mark.parametrize("name", list(UNEVEN))
def test_uneven_plan_is_refused_with_suggestions_that_export(fmt: str, name: str) -> None:
    body = UNEVEN[name]
    x = export_input(body)
    assert x.plan.micro_batch_size is None
    with pytest.raises(ExportUnsupported) as caught:
        export(fmt, x)
    err = caught.value
    if fmt in NEEDS_ONE_SHAPE and name.startswith("mixed"):
        # No batch change gives 8- and 4-GPU nodes one process count: the refusal says so and
        # suggests no batch that would be refused all the same.
        assert "GPUs per node" in err.detail and err.pointer == "/topology/node_groups"
        assert not err.suggestions and not err.combined_suggestions
        return
    assert "different micro-batches" in err.detail
    assert err.suggestions or err.combined_suggestions, "the nearest even split is named"
    for field, values in err.suggestions.items():
        assert values and body.get(field) not in values, f"{field}: {values} repeats the value sent"
        for value in values:
            # Substituted alone, with everything else as sent: the export succeeds.
            assert _exports(fmt, {**body, field: value}), f"{field}={value}"
    for change in err.combined_suggestions:
        assert all(body.get(field) != value for field, value in change.items()), change
        assert not any(_exports(fmt, {**body, field: value}) for field, value in change.items()), change
        assert _exports(fmt, {**body, **change}), change


def test_suggestions_of_an_uneven_refusal_by_shape() -> None:
    single = caught_refusal("deepspeed", UNEVEN["mixed"])
    assert single.suggestions["micro_batch_size"][0] == 25 and "global_batch_size" not in single.suggestions
    assert "micro_batch_size 25 alone gives an even split" in single.detail
    paired = caught_refusal("deepspeed", UNEVEN["mixed_1001"])
    assert not paired.suggestions
    assert paired.combined_suggestions[0] == {"global_batch_size": 1000, "micro_batch_size": 25}
    assert "global_batch_size 1000 together with micro_batch_size 25" in paired.detail
    balanced = caught_refusal("hf-trainer", UNEVEN["balanced"])
    assert balanced.suggestions["global_batch_size"][:2] == [992, 1008] and not balanced.combined_suggestions


def caught_refusal(fmt: str, body: dict[str, Any]) -> ExportUnsupported:
    with pytest.raises(ExportUnsupported) as caught:
        export(fmt, export_input(body))
    return caught.value


# ----------------------------------------------------------------------------- Python texts


def test_hf_training_arguments_give_the_global_batch() -> None:
    x = export_input(EXAMPLES["dataset_and_lr"]["value"])
    kwargs = call_kwargs(export("hf-trainer", x).text, "TrainingArguments")
    lr = x.plan.learning_rate
    assert lr is not None
    # The Trainer's batch is per device x accumulation x world size.
    assert kwargs["per_device_train_batch_size"] * kwargs["gradient_accumulation_steps"] * 16 == 512
    assert kwargs["learning_rate"] == lr.lr  # the peak; PlanTrainer's schedule warms up to it
    assert kwargs["max_grad_norm"] == 0.0  # the Trainer clips at 1.0 unless told


def test_lightning_trainer_and_loader() -> None:
    x = export_input(EXAMPLES["round_down"]["value"])
    text = export("lightning", x).text
    trainer = call_kwargs(text, "Trainer")
    assert trainer == {
        "accelerator": "gpu",
        "devices": 8,
        "num_nodes": 2,
        "strategy": "ddp",
        "accumulate_grad_batches": x.plan.gradient_accumulation_steps,
        "use_distributed_sampler": False,  # the export's hook gives the plan's sampler
        "gradient_clip_val": None,  # stated: no clipping (and so no clipping algorithm)
        "max_epochs": 1,  # no dataset, no run length: one pass
    }
    assert call_kwargs(text, "DataLoader")["batch_size"] == x.plan.micro_batch_size


@pytest.mark.parametrize(
    "name", ["homogeneous", "dataset_and_lr", "round_down", "mixed", "mixed_curves", "measured_lr"]
)
def test_python_skeleton_compiles_and_holds_the_plan(name: str) -> None:
    x = export_input(EXAMPLES[name]["value"])
    text = export("python", x).text
    tree = ast.parse(text)
    constants = {
        t.id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name) and t.id.isupper() and isinstance(node.value, ast.Constant | ast.List)
    }
    assert constants["GLOBAL_BATCH_SIZE"] == x.plan.global_batch_size
    groups = constants["REPLICA_GROUPS"]
    assert sum(
        (stop - start) * micro for start, stop, micro, _ in groups
    ) * x.plan.gradient_accumulation_steps == (x.plan.global_batch_size)
    # Each replica group's own micro-batch (a curve's split too), rank for rank.
    assert [(s, e, m) for s, e, m, _ in groups] == [
        (g.start, g.stop, g.micro_batch_size) for g in x.plan.replica_groups
    ]
    # Self-contained: a file users copy, so the sampler is written into it, never imported.
    assert "import app" not in text and "from app" not in text
    assert ("class ProportionalSampler" in text) == (x.plan.split == "proportional")


def test_python_skeleton_refuses_model_parallel_plans() -> None:
    # Tensor parallel and FSDP/HSDP get the mesh skeleton (test_exports_mesh_run.py); a
    # pipeline split is the model's own, so the example's pipeline 2 is refused, by field.
    with pytest.raises(ExportUnsupported, match="pipeline parallel depends") as refused:
        export("python", export_input(EXAMPLES["megatron"]["value"]))
    assert refused.value.pointer == "/parallelism/pipeline"


def test_every_registered_format_exports_the_homogeneous_example() -> None:
    x = export_input(EVEN["homogeneous"])
    for fmt in EXPORTERS:
        out = export(fmt, x)
        assert out.format == fmt and out.text.endswith("\n")


# ----------------------------------------------------------------------------- issue 14


def test_pytorchjob_names_are_dns_1035_labels_with_room_for_worker_pod_names() -> None:
    from dataclasses import replace

    from fastapi.testclient import TestClient

    from app.core.errors.domain import InvalidValue
    from app.main import create_app

    x = export_input(EVEN["homogeneous"])  # 2 nodes: the longest pod name is <name>-worker-0
    longest_ok = "a" * (63 - len("-worker-0"))
    export("kubernetes", replace(x, options=replace(x.options, job_name=longest_ok)))
    for bad in ("a" + longest_ok, "1job"):
        with pytest.raises(InvalidValue, match="DNS-1035"):
            export("kubernetes", replace(x, options=replace(x.options, job_name=bad)))
    with TestClient(create_app()) as client:
        response = client.post("/v1/plans/export/kubernetes?job_name=1job", json=EVEN["homogeneous"])
        assert response.status_code == 422 and "job_name" in response.text
        response = client.post(
            f"/v1/plans/export/kubernetes?job_name=a{longest_ok}", json=EVEN["homogeneous"]
        )
        assert response.status_code == 422 and "DNS-1035" in response.json()["detail"]


def test_hf_trainer_states_that_it_drops_the_leftover_micro_batches() -> None:
    body = {
        "topology": {"num_nodes": 1, "gpus_per_node": 1},
        "global_batch_size": 8,
        "micro_batch_size": 2,
        "dataset": {"num_samples": 30, "epochs": 2},
        "learning_rate": {"base_lr": 0.1, "base_batch_size": 8},
    }
    text = export("hf-trainer", export_input(body)).text
    assert (
        "steps per epoch: 3, as planned; the 3 micro-batches left over at the end of each epoch are " in text
    )
