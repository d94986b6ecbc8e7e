"""POST /v1/checks with `resume`: each request a resume check cannot run is a 422
problem+json at its field (/resume/at_step, /resume/data_parallel_size, /steps), and every
value it suggests, sent back, is accepted. On a fake runner: the refusals come before any rank
runs (tests/worker/checks/resume/test_resume_check.py runs the check itself)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.apps import fake_client
from support.problems import assert_field_error

PLAN: dict[str, Any] = {
    "topology": {"num_nodes": 1, "gpus_per_node": 4},
    "global_batch_size": 32,
    "micro_batch_size": 4,
    "dataset": {"num_samples": 320, "shuffle": True, "seed": 0},
}
# docs/resume.md's epoch of 100 samples: on 2 replicas it ends elsewhere than on 4.
TAIL: dict[str, Any] = {
    "topology": {"num_nodes": 1, "gpus_per_node": 4},
    "global_batch_size": 12,
    "micro_batch_size": 3,
    "dataset": {"num_samples": 100, "epochs": 2},
}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    yield from fake_client(tmp_path_factory)


def body(plan: dict[str, Any] = PLAN, steps: int = 20, **resume: int) -> dict[str, Any]:
    return {"plan": plan, "steps": steps, "resume": resume}


def refused(client: TestClient, sent: dict[str, Any], pointer: str) -> dict[str, Any]:
    """A 422 at `pointer` whose every suggestion is accepted when sent back."""
    problem = assert_field_error(client.post("/v1/checks", json=sent), pointer)
    assert problem["suggestions"], problem
    for key, values in problem["suggestions"].items():
        for value in values:
            fixed = dict(sent)
            if key.startswith("resume."):
                fixed["resume"] = {**sent["resume"], key.split(".", 1)[1]: value}
            elif key.startswith("dataset."):
                dataset = {**sent["plan"]["dataset"], key.split(".", 1)[1]: value}
                fixed["plan"] = {**sent["plan"], "dataset": dataset}
            else:
                fixed[key] = value
            answer = client.post("/v1/checks", json=fixed)
            assert answer.status_code == 202, (key, value, answer.text)
    return problem


def test_a_resume_check_is_accepted(client: TestClient) -> None:
    answer = client.post("/v1/checks", json=body(at_step=7, data_parallel_size=2))
    assert answer.status_code == 202, answer.text


def test_a_resume_past_the_run_is_refused_at_at_step(client: TestClient) -> None:
    problem = refused(client, body(at_step=20, data_parallel_size=2), "/resume/at_step")
    assert problem["suggestions"] == {"resume.at_step": [19]}
    assert "1 to 19" in problem["detail"]


def test_a_resume_before_the_first_step_is_refused_at_at_step(client: TestClient) -> None:
    assert_field_error(
        client.post("/v1/checks", json=body(at_step=0, data_parallel_size=2)), "/resume/at_step"
    )


def test_a_resume_without_a_run_is_refused_at_steps(client: TestClient) -> None:
    sent = {"plan": PLAN, "resume": {"at_step": 3, "data_parallel_size": 2}}
    problem = refused(client, sent, "/steps")
    assert problem["suggestions"] == {"steps": [4]}


def test_replicas_that_cannot_keep_the_global_batch_are_refused(client: TestClient) -> None:
    problem = refused(client, body(at_step=7, data_parallel_size=3), "/resume/data_parallel_size")
    assert "does not split over 3 replicas" in problem["detail"]
    assert problem["suggestions"]["resume.data_parallel_size"] == [4, 2, 1]


def test_more_replicas_than_the_plan_has_are_refused(client: TestClient) -> None:
    problem = refused(client, body(at_step=7, data_parallel_size=8), "/resume/data_parallel_size")
    assert "more than the plan's 4 replicas" in problem["detail"]


def test_a_sampler_that_cannot_resume_exactly_is_refused(client: TestClient) -> None:
    """The plan's resume.same_global_batches is false: no resume could match the run."""
    problem = refused(client, body(TAIL, 16, at_step=11, data_parallel_size=2), "/resume/data_parallel_size")
    assert "does not see the uninterrupted run's global batches" in problem["detail"]
    assert 2 not in problem["suggestions"]["resume.data_parallel_size"]
    # The plan's own fixes, as its warnings name them, each sent back above and accepted.
    assert problem["suggestions"]["dataset.num_samples"] == [96, 103], problem


def test_a_result_stored_before_the_resume_check_still_reads(client: TestClient) -> None:
    """`resume` is the last field of the result, with a default: a stored result without it decodes."""
    from support.polling import run_check

    from app.contract.check_result import CheckResult
    from app.contract.codec import decode

    job = run_check(client, {"plan": PLAN, "steps": 4}, timeout=30)
    stored = {k: v for k, v in job["result"].items() if k != "resume"}
    assert job["result"]["resume"] is None
    assert decode(CheckResult, stored).resume is None
