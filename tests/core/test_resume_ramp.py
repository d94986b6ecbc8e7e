"""A ramp-up run resumes by consumed samples (POST /v1/plans/schedule with the plan's resume):
held against megatron-core's own RampupBatchsizeNumMicroBatchesCalculator, built for the
resumed data-parallel size and updated with the consumed samples, as Megatron does on loading
a checkpoint; and every refusal a 422 at its field whose suggestions, sent back, are answered."""

from __future__ import annotations

import random
from typing import Any

import pytest
from fastapi.testclient import TestClient
from megatron_calculator import calculator_module

from app.core.learning_rate.schedule import schedule
from app.core.planner import plan
from app.core.records.resume import ResumeSpec
from app.core.records.schedule import Rampup, ScheduleSpec
from app.core.resume.ramp import with_resume
from app.schemas.plan_requests import PlanRequestIn

MEGATRON = calculator_module()


def _consumed_per_step(rampup: Rampup, target: int, micro: int, dp: int, steps: int) -> list[int]:
    """The samples consumed before each step, as Megatron's training loop counts them."""
    assert MEGATRON is not None
    calc = MEGATRON.RampupBatchsizeNumMicroBatchesCalculator(
        target,
        micro,
        dp,
        False,
        1,
        rampup.start_batch_size,
        rampup.batch_size_increment,
        rampup.rampup_samples,
    )
    consumed, out = 0, []
    for _ in range(steps):
        out.append(consumed)
        calc.update(consumed, True)
        consumed += calc.get_current_global_batch_size()
    return out


@pytest.mark.skipif(MEGATRON is None, reason="megatron-core is not installed (consumers group)")
def test_the_resumed_step_batch_and_micro_batches_are_megatrons() -> None:
    assert MEGATRON is not None
    rng = random.Random(37)
    for _ in range(200):
        micro, dp = rng.randint(1, 3), rng.choice([2, 4, 6])
        unit = micro * dp
        start, increment = rng.randint(1, 5) * unit, rng.randint(1, 3) * unit
        target = start + increment * rng.randint(1, 20)
        rampup = Rampup(start, increment, rng.randint(1, target * 8))
        steps = rampup.rampup_samples // start + 3
        body = {
            "topology": {"num_nodes": 1, "gpus_per_node": dp},
            "global_batch_size": target,
            "micro_batch_size": micro,
        }
        planned = plan(PlanRequestIn.model_validate(body).to_core())
        spec = ScheduleSpec(train_steps=steps, rampup=rampup)
        step = rng.randrange(steps)
        consumed = _consumed_per_step(rampup, target, micro, dp, steps)[step]
        replicas = rng.choice([d for d in range(1, dp + 1) if dp % d == 0])
        found = with_resume(
            schedule(planned, spec), planned, spec, ResumeSpec(None, consumed, replicas)
        ).resume
        assert found is not None and found.optimizer_step == step and found.remaining_steps == steps - step
        calc = MEGATRON.RampupBatchsizeNumMicroBatchesCalculator(
            target, micro, replicas, False, 1, start, increment, rampup.rampup_samples
        )
        calc.update(consumed, True)
        assert (found.global_batch_size, found.gradient_accumulation_steps) == (
            calc.get_current_global_batch_size(),
            calc.get(),
        )
        assert found.skip_micro_batches * micro * replicas == consumed


RAMP: dict[str, Any] = {
    "plan": {
        "topology": {"num_nodes": 1, "gpus_per_node": 4},
        "global_batch_size": 64,
        "micro_batch_size": 4,
        "learning_rate": {
            "base_lr": 0.1,
            "base_batch_size": 64,
            "warmup_steps": 5,
            "decay": "cosine",
            "train_steps": 40,
        },
    },
    "train_steps": 40,
    "rampup": {"start_batch_size": 16, "batch_size_increment": 16, "rampup_samples": 480},
}


def _with_resume(**resume: Any) -> dict[str, Any]:
    return {**RAMP, "plan": {**RAMP["plan"], "resume": resume}}


def _answered(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/plans/schedule", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_ramp_resume_gives_the_schedules_lr_at_the_step(client: TestClient) -> None:
    whole = client.post("/v1/plans/schedule", json={**RAMP, "max_points": 40}).json()
    at = whole["points"][12]
    resume = _answered(client, _with_resume(consumed_samples=at["consumed_samples"], data_parallel_size=2))[
        "resume"
    ]
    assert resume["optimizer_step"] == 12 and resume["lr"] == at["lr"] != whole["points"][0]["lr"]
    assert resume["global_batch_size"] == at["global_batch_size"]
    assert resume["gradient_accumulation_steps"] == at["global_batch_size"] // (4 * 2)
    assert resume["epoch"] is None and resume["same_global_batches"] is True


@pytest.mark.parametrize(
    ("resume", "pointer"),
    [
        ({"consumed_samples": 100}, "/plan/resume/consumed_samples"),  # inside a step
        ({"consumed_samples": 10**6}, "/plan/resume/consumed_samples"),  # past the run's end
        ({"optimizer_step": 12}, "/plan/resume/optimizer_step"),  # a ramp counts samples
        ({"consumed_samples": 160, "data_parallel_size": 3}, "/plan/resume/data_parallel_size"),
    ],
)
def test_a_ramp_resume_that_cannot_be_is_refused_with_values_that_work(
    client: TestClient, resume: dict[str, Any], pointer: str
) -> None:
    response = client.post("/v1/plans/schedule", json=_with_resume(**resume))
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["errors"][0]["pointer"] == pointer and problem["suggestions"]
    for key, values in problem["suggestions"].items():
        for value in values:
            fixed = {k: v for k, v in resume.items() if k != "optimizer_step"} | {key.split(".", 1)[1]: value}
            _answered(client, _with_resume(**fixed))
