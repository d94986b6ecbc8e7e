"""The explanation answers the question the project exists for, in the plan's own numbers
(issue 40): each process's loss is a mean over its micro-batch, DDP averages the replicas'
gradients, and a mean of equal-size means is the mean over the global batch; with unequal
micro-batches it is not, which the loss scales fix. It never answers a question nobody asked
("Yes, split the batch"), and a plan without warmup says so instead of "warmup 0 steps"."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from app.core.errors.domain import DomainError
from app.core.exports.parts.export_types import ExportInput
from app.core.exports.registry import EXPORTERS
from app.core.planner import plan
from app.core.records.plan import Plan
from app.schemas.examples import PLAN_EXAMPLES
from app.schemas.plan_requests import PlanRequestIn

ONE_NODE = {"topology": {"num_nodes": 1, "gpus_per_node": 8}, "micro_batch_size": 64}
LINEAR = {"base_lr": 0.1, "base_batch_size": 64, "rule": "linear"}


def _plan(body: dict[str, Any]) -> Plan:
    return plan(PlanRequestIn.model_validate(body).to_core())


def _why(planned: Plan) -> str:
    [sentence] = [s for s in planned.explanation if "averages the" in s and "replicas' gradients" in s]
    return sentence


@pytest.mark.parametrize("accumulation", [1, 4])
def test_an_even_plan_says_why_the_mean_of_equal_means_is_the_global_mean(accumulation: int) -> None:
    planned = _plan({**ONE_NODE, "gradient_accumulation_steps": accumulation, "learning_rate": LINEAR})
    [group] = planned.replica_groups
    dp, big = planned.data_parallel_size, planned.global_batch_size
    sentence = _why(planned)
    assert f"Each process's loss is a mean over its {group.samples_per_step} samples" in sentence
    assert f"DDP's all-reduce averages the {dp} replicas' gradients" in sentence
    assert f"a mean of {dp} equal-size means is the mean over all {big} samples" in sentence
    assert f"the gradient of one GPU with a batch of {big}" in sentence
    assert "unequal micro-batches" in sentence and "loss scales" in sentence
    # What it says is what torch computes: the replicas' mean-loss gradients, averaged as DDP
    # does, are the gradient of one process's mean loss over the whole batch.
    torch.manual_seed(0)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    x = torch.randn(big, 3, dtype=torch.float64)
    micro = planned.micro_batch_size
    assert micro is not None and group.loss_scale is not None
    per_replica = []
    for r in range(dp):  # each replica accumulates its micro-batches' scaled mean losses
        losses = [(mb @ w).square().mean() * group.loss_scale for mb in x[r::dp].split(micro)]
        per_replica.append(torch.autograd.grad(sum(losses), w)[0])
    whole = torch.autograd.grad((x @ w).square().mean(), w)[0]
    torch.testing.assert_close(torch.stack(per_replica).mean(0), whole, rtol=1e-13, atol=0)


@pytest.mark.parametrize(
    ("parallelism", "averaging", "one"),
    [
        ({"tensor": 2}, "DDP's all-reduce", "one model replica"),
        ({"data_parallel_shard": 4}, "FSDP's reduce-scatter", "one GPU"),
        ({"data_parallel_shard": 2}, "FSDP's reduce-scatter", "one GPU"),  # HSDP
    ],
)
def test_a_mesh_plan_names_what_averages_its_replicas(
    parallelism: dict[str, int], averaging: str, one: str
) -> None:
    planned = _plan({**ONE_NODE, "parallelism": parallelism})
    sentence = _why(planned)
    assert f"{averaging} averages the {planned.data_parallel_size} replicas' gradients" in sentence
    assert f"the gradient of {one} with a batch of {planned.global_batch_size}" in sentence


def test_an_uneven_plan_says_its_unequal_means_need_the_loss_scales() -> None:
    planned = _plan(PLAN_EXAMPLES["mixed"]["value"])
    micros = sorted({g.micro_batch_size for g in planned.replica_groups})
    assert len(micros) > 1
    sentence = _why(planned)
    assert f"its own micro-batch ({micros[0]} to {micros[-1]} samples here)" in sentence
    dp = planned.data_parallel_size
    assert f"DDP's all-reduce averages the {dp} replicas' gradients with equal weights" in sentence
    assert f"is not the mean over all {planned.global_batch_size} samples" in sentence


@pytest.mark.parametrize("name", list(PLAN_EXAMPLES))
def test_no_explanation_answers_a_question_the_request_did_not_ask(name: str) -> None:
    assert not [s for s in _plan(PLAN_EXAMPLES[name]["value"]).explanation if s.startswith("Yes")]


def test_a_plan_without_warmup_says_no_warmup_in_every_export_header() -> None:
    body = {**ONE_NODE, "learning_rate": LINEAR}
    request = PlanRequestIn.model_validate(body).to_core()
    planned = plan(request)
    assert planned.learning_rate is not None and planned.learning_rate.warmup_steps == 0
    written = 0
    for fmt, exporter in EXPORTERS.items():
        try:
            text = exporter(ExportInput(request, planned)).text
        except DomainError:
            continue  # torchtitan takes Adam only: nothing written to read
        assert "warmup 0 steps" not in text, fmt
        if "learning rate 0.8 (" in text:
            written += 1
            assert "learning rate 0.8 (linear rule from 0.1 per 64), no warmup" in text, fmt
    assert written >= 7
    warmed = _plan({**body, "learning_rate": {**LINEAR, "warmup_steps": 10}})
    exported = EXPORTERS["torchrun"](
        ExportInput(
            PlanRequestIn.model_validate({**body, "learning_rate": {**LINEAR, "warmup_steps": 10}}).to_core(),
            warmed,
        )
    ).text
    assert "warmup 10 steps from 0.1" in exported
