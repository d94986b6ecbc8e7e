"""The resume check on real gloo ranks (the session's default warm server, tests/conftest.py):
a run checkpointed after `at_step` steps on the plan's replicas and resumed on fewer, the
same plan re-made for them, matches the uninterrupted single-process reference at every step
on a DDP plan, a tokens plan and an FSDP2 plan; every resume control that changes the run is
detected, and the ones that cannot are skipped with the reason."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from fastapi.testclient import TestClient
from support.polling import check_result

from app.schemas.check_examples import CHECK_EXAMPLES
from app.worker.checks.resume.controls import (
    RESUME_KEEPS_MICRO_BATCH,
    RESUME_PER_RANK_POSITION,
    RESUME_SCHEDULE_RESTART,
    RESUME_WITHOUT_SKIP,
)

pytestmark = pytest.mark.slow

RESUME_CONTROLS = {
    c.name
    for c in (
        RESUME_WITHOUT_SKIP,
        RESUME_SCHEDULE_RESTART,
        RESUME_KEEPS_MICRO_BATCH,
        RESUME_PER_RANK_POSITION,
    )
}
FOUR = {"num_nodes": 1, "gpus_per_node": 4}
# A schedule that changes at every step, so that restarting it changes the run.
RECIPE = {"base_lr": 0.05, "rule": "none", "warmup_steps": 3, "warmup_start_lr": 0.0, "decay": "cosine"}


@pytest.fixture
def worker(default_worker: TestClient) -> TestClient:
    return default_worker


def resumed(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    """A resume check that must pass: every step, before the checkpoint and after, within the
    run's tolerance of the uninterrupted reference; every resume control accounted for."""
    result = check_result(client, body, timeout=240)
    assert result["passed"] and result["trajectory_matches"], result
    steps, resume = body["steps"], result["resume"]
    assert [s["step"] for s in result["trajectory"]] == list(range(steps))
    assert all(s["params_rel_l2"] <= result["run_tolerance"] for s in result["trajectory"])
    assert resume["matches"] and resume["at_step"] == body["resume"]["at_step"]
    assert resume["data_parallel_size_after"] == body["resume"]["data_parallel_size"]
    ran = {c["name"]: c for c in result["controls"]}
    skipped = {c["name"] for c in result["controls_skipped"]}
    assert RESUME_CONTROLS <= set(ran) | skipped and not set(ran) & skipped
    for name in RESUME_CONTROLS & set(ran):
        assert ran[name]["detected"] and ran[name]["rel_l2"] > 1e-6, ran[name]
        steps_run = result["control_trajectories"][name]
        assert [s["step"] for s in steps_run] == list(range(resume["at_step"], steps))
    return result


def test_a_ddp_run_resumes_on_half_its_replicas(worker: TestClient) -> None:
    """The OpenAPI example: 4 replicas of micro-batch 4, resumed after 7 steps on 2 of them
    (micro-batch 4, accumulation 4), in the first of two epochs: every resume control bites
    but the schedule's (SGD at a constant lr)."""
    body = CHECK_EXAMPLES["resume"]["value"]
    result = resumed(worker, body)
    resume = result["resume"]
    assert (resume["epoch"], resume["step_in_epoch"], resume["data_parallel_size_before"]) == (0, 7, 4)
    assert (resume["micro_batch_size"], resume["gradient_accumulation_steps"]) == (4, 4)
    # The core's skip: 7 steps x 32 samples over 2 replicas, 112 of each one's shard.
    assert resume["replica_groups"] == [
        {"start": 0, "stop": 2, "micro_batch_size": 4, "skip_micro_batches": 28, "skip_samples": 112}
    ]
    assert [s["epoch"] for s in result["trajectory"]] == [0] * 10 + [1] * 10
    ran = {c["name"] for c in result["controls"]}
    assert {"resume_without_skip", "resume_keeps_micro_batch", "resume_per_rank_position"} <= ran
    [restart] = [c for c in result["controls_skipped"] if c["name"] == "resume_schedule_restart"]
    assert "the schedule gives the same lr" in restart["reason"]


def test_every_resume_control_is_detected_with_a_schedule(worker: TestClient) -> None:
    plan = {
        "topology": FOUR,
        "global_batch_size": 16,
        "micro_batch_size": 2,
        "dataset": {"num_samples": 96, "shuffle": True, "seed": 3},
        "learning_rate": {**RECIPE, "base_batch_size": 16, "train_steps": 10, "max_grad_norm": 0.5},
    }
    result = resumed(worker, {"plan": plan, "steps": 10, "resume": {"at_step": 4, "data_parallel_size": 2}})
    assert RESUME_CONTROLS <= {c["name"] for c in result["controls"]}


def test_a_resume_at_an_epochs_start_has_nothing_to_skip(worker: TestClient) -> None:
    plan = {"topology": FOUR, "global_batch_size": 16, "micro_batch_size": 2}
    body = {"plan": plan, "steps": 8, "resume": {"at_step": 4, "data_parallel_size": 2}}
    result = resumed(worker, body)  # the default dataset: 4 steps an epoch
    assert result["resume"]["replica_groups"][0]["skip_micro_batches"] == 0
    reasons = {c["name"]: c["reason"] for c in result["controls_skipped"]}
    assert "falls on an epoch's start" in reasons["resume_without_skip"]
    assert "resume_keeps_micro_batch" in {c["name"] for c in result["controls"]}


def test_a_tokens_run_resumes(worker: TestClient) -> None:
    plan = {
        "topology": FOUR,
        "sequence_length": 16,
        "global_batch_tokens": 32 * 16,
        "micro_batch_tokens": 4 * 16,
        "loss_normalization": "token",
    }
    result = resumed(worker, {"plan": plan, "steps": 8, "resume": {"at_step": 3, "data_parallel_size": 2}})
    assert result["workload"] == "tokens"
    assert all(s["valid_tokens"] for s in result["trajectory"])
    assert {"resume_without_skip", "resume_keeps_micro_batch", "resume_per_rank_position"} <= {
        c["name"] for c in result["controls"]
    }


def test_an_fsdp2_run_resumes_on_a_smaller_mesh(worker: TestClient) -> None:
    plan = {
        "topology": FOUR,
        "global_batch_size": 16,
        "micro_batch_size": 2,
        "parallelism": {"data_parallel_shard": 4},
        "dataset": {"num_samples": 96, "shuffle": True, "seed": 1},
        "learning_rate": {**RECIPE, "base_batch_size": 16, "optimizer": "adamw", "train_steps": 8},
    }
    result = resumed(worker, {"plan": plan, "steps": 8, "resume": {"at_step": 3, "data_parallel_size": 2}})
    assert result["wrapper"] == "fsdp" and "torch.distributed.checkpoint" in result["resume"]["checkpoint"]
    assert RESUME_CONTROLS <= {c["name"] for c in result["controls"]}
