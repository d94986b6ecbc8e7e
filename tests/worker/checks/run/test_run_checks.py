"""Checks of several optimizer steps on real gloo ranks: the plan's recipe trained through its
sampler across epochs, held step by step against the single-process reference run
(app.worker.training.reference_run), with the run-level controls detected where they change
the run. The worker tests' shared app with four warm ranks serves the module
(tests/worker/conftest.py); every dataset is a few global batches.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from fastapi.testclient import TestClient
from support.bodies import RUN_RECIPE, fast_and_slow
from support.polling import check_result, hold_ranks, run_check

from app.schemas.check_examples import CHECK_EXAMPLES
from app.worker.checks.run.controls import RUN_CONTROLS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[4]
RUN_CONTROL_NAMES = {c.name for c in RUN_CONTROLS}
FOUR = {"num_nodes": 1, "gpus_per_node": 4}


@pytest.fixture
def client(models_worker: TestClient) -> TestClient:
    return models_worker


def run_result(client: TestClient, plan: dict[str, Any], steps: int, **options: Any) -> dict[str, Any]:
    """A run that must pass: every step of the plan's run is the reference run's."""
    result = check_result(client, {"plan": plan, "steps": steps, **options}, timeout=240)
    assert result["passed"] and result["trajectory_matches"], result
    assert result["steps"] == steps == len(result["trajectory"])
    assert [s["step"] for s in result["trajectory"]] == list(range(steps))
    for step in result["trajectory"]:
        assert step["within_tolerance"] and step["params_rel_l2"] <= result["run_tolerance"] == 1e-12
        assert step["loss"] == pytest.approx(step["reference_loss"], rel=1e-12)
    assert result["final_params_rel_l2"] == result["trajectory"][-1]["params_rel_l2"]
    ran = {c["name"] for c in result["controls"]}
    assert all(c["detected"] for c in result["controls"]), result["controls"]
    # Every run-level control ran, or says why it could not change this run.
    assert RUN_CONTROL_NAMES <= ran | {c["name"] for c in result["controls_skipped"]}
    assert set(result["control_trajectories"]) == ran & RUN_CONTROL_NAMES
    return result


def epochs(result: dict[str, Any]) -> list[int]:
    return [s["epoch"] for s in result["trajectory"]]


def test_every_run_level_control_is_detected_where_it_changes_the_run(client: TestClient) -> None:
    """The OpenAPI example: 4 replicas, accumulation 2, a shuffled dataset of two epochs, a
    recipe with warmup, decay and clipping. The first step's controls still run on its gradient."""
    body = CHECK_EXAMPLES["run"]["value"]
    result = run_result(client, body["plan"], body["steps"])
    assert epochs(result) == [0] * 10 + [1] * 10
    by_name = {c["name"]: c for c in result["controls"]}
    assert RUN_CONTROL_NAMES <= set(by_name)
    for name in RUN_CONTROL_NAMES:  # far outside the tolerance, at the end of the run
        assert by_name[name]["rel_l2"] > 1e-3, by_name[name]
        steps = result["control_trajectories"][name]
        assert [s["step"] for s in steps] == list(range(20))
    assert {"accumulation_not_divided", "no_distributed_sampler"} <= set(by_name)
    # The mistakes' own lrs: the schedule read at k x accumulation + 1, and at k x 4 processes.
    lrs = [s["lr"] for s in result["trajectory"]]
    per_micro = [s["lr"] for s in result["control_trajectories"]["scheduler_per_micro_batch"]]
    per_process = [s["lr"] for s in result["control_trajectories"]["scheduler_per_process"]]
    assert per_micro[:2] == [lrs[1], lrs[3]] and per_process[:2] == [lrs[0], lrs[4]]
    # Without set_epoch the second epoch repeats the first's batches: the runs part there.
    missing = result["control_trajectories"]["set_epoch_missing"]
    assert all(m["params_rel_l2"] == 0 for m in missing[:10]) and missing[10]["params_rel_l2"] > 0


def test_controls_that_cannot_change_the_run_are_skipped_with_the_reason(client: TestClient) -> None:
    """No accumulation, one epoch, no shuffle, a constant lr, clipping that never bites."""
    plan = {
        "topology": FOUR,
        "global_batch_size": 16,
        "dataset": {"num_samples": 160, "shuffle": False},
        "learning_rate": {"base_lr": 0.05, "rule": "none", "max_grad_norm": 1000.0},
    }
    result = run_result(client, plan, 4)
    skipped = {c["name"]: c["reason"] for c in result["controls_skipped"]}
    assert skipped["scheduler_per_micro_batch"].startswith("gradient_accumulation_steps is 1")
    assert skipped["scheduler_per_process"].startswith("the schedule gives the same lr at every step")
    assert skipped["set_epoch_missing"].startswith("the dataset is not shuffled")
    assert skipped["clip_before_all_reduce"].startswith("clipping never bites on these steps")
    assert result["control_trajectories"] == {}


def test_an_accumulated_plan_drops_each_epochs_leftover_micro_batches(client: TestClient) -> None:
    """37 samples on 2 replicas of micro-batch 2, accumulation 3: 10 micro-steps an epoch, the
    last left over; its first step's controls run too."""
    plan = {
        "topology": {"num_nodes": 1, "gpus_per_node": 2},
        "global_batch_size": 12,
        "micro_batch_size": 2,
        "dataset": {"num_samples": 37, "seed": 3},
        "learning_rate": {**RUN_RECIPE, "optimizer": "adam", "decay": "linear", "min_lr": 0.001},
    }
    result = run_result(client, plan, 7)
    assert epochs(result) == [0, 0, 0, 1, 1, 1, 2]
    assert result["epoch_end"] == {
        "optimizer_steps_per_epoch": 3,
        "epochs_run": 3,
        "leftover": "dropped",
        "leftover_micro_steps": 1,
        "short_micro_batch_samples": None,
    }


def test_an_even_plans_short_last_micro_batch_is_weighted_as_the_plan_says(client: TestClient) -> None:
    """33 samples over 2 replicas of micro-batch 3: each epoch ends in a step of 2 samples per
    replica, each weighted by its own mean times the plan's loss scale."""
    plan = {
        "topology": {"num_nodes": 1, "gpus_per_node": 2},
        "global_batch_size": 6,
        "micro_batch_size": 3,
        "dataset": {"num_samples": 33, "seed": 7},
        "learning_rate": {**RUN_RECIPE, "momentum": 0.8, "nesterov": True},
    }
    result = run_result(client, plan, 8)
    assert epochs(result) == [0] * 6 + [1] * 2
    assert result["epoch_end"]["short_micro_batch_samples"] == 2


def test_an_uneven_mixed_gpu_plan_runs_two_epochs(client: TestClient) -> None:
    plan = {**fast_and_slow(2.0, 24), "dataset": {"num_samples": 48, "seed": 1}, "learning_rate": RUN_RECIPE}
    result = run_result(client, plan, 4)
    assert result["split"] == "proportional" and result["micro_batch_sizes"] == [8, 16]
    assert epochs(result) == [0, 0, 1, 1]
    assert "unweighted_mean" in {c["name"] for c in result["controls"]}


def test_more_replicas_than_processes_run_as_the_plan_says(client: TestClient) -> None:
    """8 replicas on 4 processes, two each, and the default dataset (an epoch of 3 steps)."""
    plan = {
        "topology": {"num_nodes": 1, "gpus_per_node": 8},
        "global_batch_size": 32,
        "learning_rate": RUN_RECIPE,
    }
    result = run_result(client, plan, 6)
    assert result["replicas_per_process"] == 2
    assert epochs(result) == [0, 0, 0, 1, 1, 1]


def test_a_token_plan_counts_each_steps_valid_tokens(client: TestClient) -> None:
    plan = {
        "topology": FOUR,
        "sequence_length": 16,
        "global_batch_tokens": 256,
        "micro_batch_tokens": 32,
        "loss_normalization": "token",
        "learning_rate": {**RUN_RECIPE, "optimizer": "adamw", "max_grad_norm": 0.2},
    }
    result = run_result(client, plan, 4, workload="tokens")
    assert epochs(result) == [0, 0, 1, 1]
    counts = [s["valid_tokens"] for s in result["trajectory"]]
    assert all(0 < c <= 256 for c in counts) and len(set(counts)) > 1
    assert {"mean_per_micro_batch", "mean_per_replica", "padding_counted"} <= {
        c["name"] for c in result["controls"]
    }
    # Checked on the synthetic samples instead, each micro-batch weighs as the mean loss does,
    # in the run as in its first step.
    samples = run_result(client, plan, 4, workload="synthetic")
    assert [s["valid_tokens"] for s in samples["trajectory"]] == [None] * 4


def mesh_plan(parallelism: dict[str, int], **more: Any) -> dict[str, Any]:
    """Four GPUs in micro-batches of 3, accumulation 2, on the mesh `parallelism` makes."""
    return {
        "topology": FOUR,
        "micro_batch_size": 3,
        "gradient_accumulation_steps": 2,
        "parallelism": parallelism,
        **more,
    }


@pytest.mark.parametrize(
    "parallelism", [{"data_parallel_shard": 4}, {"data_parallel_shard": 2}, {"tensor": 2}, {"pipeline": 2}]
)
def test_a_mesh_plan_runs_on_its_mesh(client: TestClient, parallelism: dict[str, int]) -> None:
    result = run_result(client, mesh_plan(parallelism, learning_rate=RUN_RECIPE), 4)
    assert result["mesh"] is not None and epochs(result) == [0, 0, 1, 1]


def test_a_mesh_run_after_checks_on_other_groups_runs_on_its_own_groups(client: TestClient) -> None:
    """DTensor caches shardings by mesh, and a mesh equals any mesh of the same shape built on
    another group (mesh_models._forget_dtensor_caches): an HSDP check, a run on two ranks, one
    on four, then a run on the HSDP mesh once failed ("Could not resolve the process group
    registered under the name 3") and cost the ranks."""
    hsdp = {"data_parallel_shard": 2}
    assert check_result(client, {"plan": mesh_plan(hsdp, dataset={"num_samples": 100, "seed": 5})})["passed"]
    two = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 12, "micro_batch_size": 2}
    run_result(client, {**two, "dataset": {"num_samples": 37, "seed": 3}, "learning_rate": RUN_RECIPE}, 3)
    for parallelism in ({"data_parallel_shard": 4}, hsdp):
        result = run_result(client, mesh_plan(parallelism, learning_rate=RUN_RECIPE), 4)
        assert result["mesh"] is not None and epochs(result) == [0, 0, 1, 1]


def test_a_wrong_combination_is_a_422_never_a_one_step_check(client: TestClient) -> None:
    cases = [
        # a run longer than the recipe's
        (
            {"plan": {"topology": FOUR, "global_batch_size": 16, "learning_rate": RUN_RECIPE}, "steps": 13},
            "/steps",
        ),
        # the search re-plans the check
        (
            {
                "plan": {"topology": FOUR, "global_batch_size": 16},
                "steps": 4,
                "fit_micro_batch": {"memory_bytes": 1 << 30},
            },
            "/fit_micro_batch",
        ),
        # a pipeline schedule cannot take an epoch's short micro-batch
        (
            {
                "plan": {
                    "topology": FOUR,
                    "micro_batch_size": 3,
                    "gradient_accumulation_steps": 2,
                    "parallelism": {"pipeline": 2},
                    "dataset": {"num_samples": 20},
                },
                "steps": 4,
            },
            "/steps",
        ),
        # context parallel trains nowhere on CPU, one step or many
        (
            {"plan": {"topology": FOUR, "global_batch_size": 8, "parallelism": {"context": 2}}, "steps": 4},
            "/plan/parallelism/context",
        ),
    ]
    for body, pointer in cases:
        response = client.post("/v1/checks", json=body)
        assert response.status_code == 422, response.text
        problem = response.json()
        assert problem["errors"][0]["pointer"] == pointer, problem
        for key, values in problem.get("suggestions", {}).items():
            fixed = json.loads(json.dumps(body))
            fixed[key] = values[0]
            job = run_check(client, fixed, timeout=240)  # the nearest value that works, works
            assert job["status"] == "succeeded" and job["result"]["passed"], job


def test_the_chart_draws_a_finished_run_and_says_why_when_there_is_none(client: TestClient) -> None:
    body = CHECK_EXAMPLES["run"]["value"]
    job = run_check(client, {**body, "steps": 4}, timeout=240)
    png = client.get(f"/v1/checks/{job['id']}/trajectory.png")
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content.startswith(b"\x89PNG\r\n\x1a\n")
    svg = client.get(f"/v1/checks/{job['id']}/trajectory.svg")
    assert svg.headers["content-type"] == "image/svg+xml" and b"<svg" in svg.content
    assert b"scheduler_per_process" in svg.content and b"reference" in svg.content
    one = run_check(client, {"plan": body["plan"]}, timeout=240)
    missing = client.get(f"/v1/checks/{one['id']}/trajectory.png")
    assert missing.status_code == 404 and "steps 1" in missing.json()["detail"]
    assert client.get(f"/v1/checks/{one['id']}/trajectory.gif").status_code == 422
    location = hold_ranks(client, {"topology": FOUR, "global_batch_size": 16}, steps=4)
    running = client.get(f"{location}/trajectory.png")
    assert running.status_code == 409 and running.headers["content-type"] == "application/problem+json"
    assert client.delete(location).status_code == 200
