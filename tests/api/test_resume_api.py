"""POST /v1/plans with `resume`: the answer's resume, and every refusal a 422 at its field whose
suggestions, each sent back, plan (the arithmetic itself is held against torch in
tests/core/test_resume_vs_torch.py)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from support.bodies import node_groups

from app.core.learning_rate.recipe_summary import lr_of
from app.core.planner import plan
from app.core.resume.layout import epoch_tail, step_block
from app.schemas.plan_requests import PlanRequestIn

BODY: dict[str, Any] = {
    "topology": {"num_nodes": 1, "gpus_per_node": 4},
    "global_batch_size": 12,
    "micro_batch_size": 3,
    "dataset": {"num_samples": 100, "epochs": 2, "seed": 3},
    "learning_rate": {"base_lr": 0.1, "base_batch_size": 12, "warmup_steps": 2, "decay": "cosine"},
}
MIXED: dict[str, Any] = {
    "topology": node_groups(("fast", 1, 2, 2.0), ("slow", 1, 1, 1.0)),
    "global_batch_size": 20,
    "gradient_accumulation_steps": 2,
    "dataset": {"num_samples": 53, "epochs": 2},
}


def _with(body: dict[str, Any], **resume: Any) -> dict[str, Any]:
    return {**body, "resume": resume}


def _refused(client: TestClient, body: dict[str, Any], pointer: str) -> dict[str, Any]:
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert [e["pointer"] for e in problem["errors"]] == [pointer], problem
    assert problem["suggestions"], problem
    for key, values in problem["suggestions"].items():
        assert key.startswith("resume.")
        for value in values:
            fixed = {**body, "resume": {**body["resume"], key.split(".", 1)[1]: value}}
            assert client.post("/v1/plans", json=fixed).status_code == 200, (key, value)
    return problem


def test_the_answer_says_where_each_rank_goes_on_and_the_schedules_lr_there(client: TestClient) -> None:
    answer = client.post("/v1/plans", json=_with(BODY, optimizer_step=11, data_parallel_size=2)).json()
    resume = answer["resume"]
    # 100 samples on 4 replicas: 9 whole steps an epoch (the last short); step 11 is epoch 1's third.
    assert (resume["epoch"], resume["step_in_epoch"], resume["consumed_samples"]) == (1, 2, 132)
    assert (resume["micro_batch_size"], resume["gradient_accumulation_steps"]) == (3, 2)
    assert resume["skip_micro_batches"] == 4
    assert resume["replica_groups"] == [
        {"start": 0, "stop": 2, "micro_batch_size": 3, "skip_micro_batches": 4, "skip_samples": 12}
    ]
    planned = plan(PlanRequestIn.model_validate(BODY).to_core())
    assert planned.learning_rate is not None
    assert resume["lr"] == lr_of(planned.learning_rate, 11) != lr_of(planned.learning_rate, 0)
    assert resume["remaining_steps"] == 18 - 11
    assert any(line.startswith("Resume at optimizer step 11") for line in answer["explanation"])
    # On 2 replicas the epoch runs 8 steps, on 4 it runs 9: the run goes on past this epoch.
    assert resume["same_global_batches"] is False and "8 whole optimizer steps" in resume["why"]
    assert any(w.startswith("resume on 2 replicas is not the uninterrupted run") for w in answer["warnings"])
    for size in resume["suggestions"]["resume.data_parallel_size"]:
        again = client.post("/v1/plans", json=_with(BODY, optimizer_step=11, data_parallel_size=size)).json()
        assert again["resume"]["same_global_batches"] is True


def test_a_resume_on_the_plans_own_replicas_is_exact_and_by_samples_the_same(client: TestClient) -> None:
    by_step = client.post("/v1/plans", json=_with(BODY, optimizer_step=4)).json()["resume"]
    by_samples = client.post("/v1/plans", json=_with(BODY, consumed_samples=48)).json()["resume"]
    assert by_step == by_samples
    assert by_step["same_global_batches"] and by_step["skip_micro_batches"] == 4
    assert by_step["data_parallel_size"] == 4 and by_step["why"] is None and by_step["suggestions"] == {}


def test_a_loaders_own_saved_state_is_a_warning_only_on_another_size(client: TestClient) -> None:
    def warned(**resume: Any) -> bool:
        answer = client.post("/v1/plans", json=_with(BODY, **resume)).json()
        return any("StatefulDataLoader" in w for w in answer["warnings"])

    assert warned(optimizer_step=4, data_parallel_size=2) and not warned(optimizer_step=4)


def test_the_epochs_tail_is_a_warning_where_the_run_ends_before_it(client: TestClient) -> None:
    body = {**BODY, "learning_rate": {**BODY["learning_rate"], "train_steps": 7}}
    answer = client.post("/v1/plans", json=_with(body, optimizer_step=3, data_parallel_size=2)).json()
    assert answer["resume"]["same_global_batches"] is True
    assert any("but the run ends before it" in w for w in answer["warnings"])


def test_a_step_past_the_runs_end_is_refused_with_the_last_step(client: TestClient) -> None:
    problem = _refused(client, _with(BODY, optimizer_step=18), "/resume/optimizer_step")
    assert problem["suggestions"] == {"resume.optimizer_step": [17]}
    _refused(client, _with(BODY, consumed_samples=18 * 12), "/resume/consumed_samples")


def test_consumed_samples_between_steps_are_refused_with_the_steps_either_side(client: TestClient) -> None:
    problem = _refused(client, _with(BODY, consumed_samples=50), "/resume/consumed_samples")
    assert problem["suggestions"] == {"resume.consumed_samples": [48, 60]}


def test_a_data_parallel_size_that_cannot_keep_the_global_batch_is_refused(client: TestClient) -> None:
    problem = _refused(
        client, _with(BODY, optimizer_step=3, data_parallel_size=5), "/resume/data_parallel_size"
    )
    assert set(problem["suggestions"]["resume.data_parallel_size"]) <= {1, 2, 3, 4, 6, 12}


def test_a_mixed_clusters_plan_is_refused_on_another_replica_count(client: TestClient) -> None:
    problem = _refused(
        client, _with(MIXED, optimizer_step=2, data_parallel_size=2), "/resume/data_parallel_size"
    )
    assert "proportional sampler" in problem["detail"]
    assert problem["suggestions"] == {"resume.data_parallel_size": [3]}


def test_a_resume_without_a_dataset_or_with_both_positions_is_refused(client: TestClient) -> None:
    body = {k: v for k, v in BODY.items() if k not in ("dataset", "learning_rate")}
    response = client.post("/v1/plans", json=_with(body, optimizer_step=1))
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/resume"
    response = client.post("/v1/plans", json=_with(BODY, optimizer_step=1, consumed_samples=12))
    assert response.status_code == 422
    assert response.json()["errors"][0]["pointer"] == "/resume/consumed_samples"
    response = client.post("/v1/plans", json=_with(BODY))
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/resume"


def test_the_layout_reads_each_step_as_one_block_of_the_epoch() -> None:
    planned = plan(PlanRequestIn.model_validate(BODY).to_core())
    tail = epoch_tail(planned)
    assert [step_block(tail, 12, k) for k in (0, 7, 8, 9)] == [(0, 12), (84, 96), (96, 100), None]


def test_the_epochs_steps_are_given_before_and_after_the_resume(client: TestClient) -> None:
    """docs/resume.md's tail example: 9 steps an epoch on 4 replicas, 8 on 2."""
    body = {**BODY, "dataset": {"num_samples": 100, "epochs": 2}}
    del body["learning_rate"]
    moved = _with(body, optimizer_step=11, data_parallel_size=2)
    resume = client.post("/v1/plans", json=moved).json()["resume"]
    assert resume["same_global_batches"] is False
    assert (resume["optimizer_steps_per_epoch_before"], resume["optimizer_steps_per_epoch_after"]) == (9, 8)
    assert resume["optimizer_steps_per_epoch"] == resume["optimizer_steps_per_epoch_after"]
    exact = client.post("/v1/plans", json=_with(body, optimizer_step=11)).json()["resume"]
    assert exact["optimizer_steps_per_epoch_before"] == exact["optimizer_steps_per_epoch_after"] == 9
