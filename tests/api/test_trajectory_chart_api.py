"""GET /v1/checks/{id}/trajectory.png|svg on a fake runner (no torch): a finished run is drawn,
and each documented problem (no such check, one step, not finished) is what the route answers."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.apps import documented_problems, fake_client, held_running, succeeded
from support.fake_runner import FakeRunner, passing_result

from app.contract.check_result import CheckResult
from app.contract.kinds.resume import ResumeOutcome
from app.contract.kinds.run import ControlStep, EpochEnd, RunOutcome, TrajectoryStep
from app.core.records.resume import ResumeGroup
from app.worker.service.runner import CheckOrder

PLAN = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}


class RunRunner(FakeRunner):
    """Checks of several steps come back with a run (a made-up one: the chart draws what it is given)."""

    async def run_check(self, order: CheckOrder) -> CheckResult:
        result = await super().run_check(order)
        if order.spec.steps == 1:
            return result
        steps = order.spec.steps
        trajectory = tuple(
            TrajectoryStep(k, k // 2, 0.1 * (k + 1), 2.0 - 0.1 * k, 2.0 - 0.1 * k, 0.0, None, True)
            for k in range(steps)
        )
        control = tuple(ControlStep(k, 0.1, 2.0 - 0.05 * k, 0.01 * k) for k in range(steps))
        run = RunOutcome(
            trajectory, 1e-12, EpochEnd(2, 2, "dropped", 0, None), {"set_epoch_missing": control}
        )
        resume = None
        if order.spec.resume_plan is not None:
            group = ResumeGroup(0, 2, 2, 4, 8)
            resume = ResumeOutcome(2, 1, 0, 2, 1, 2, 4, (group,), "made up", True)
        return dataclasses.replace(passing_result(order), steps=steps, run=run, resume=resume)


@pytest.fixture(scope="module")
def runner() -> RunRunner:
    return RunRunner()


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, runner: RunRunner) -> Iterator[TestClient]:
    yield from fake_client(tmp_path_factory, runner)


def _problems(client: TestClient, status: str) -> dict[str, Any]:
    return documented_problems(client, "/v1/checks/{check_id}/trajectory.{format}", status)


def test_a_finished_run_is_drawn_as_png_and_svg(client: TestClient) -> None:
    job = succeeded(client, {"plan": PLAN, "steps": 4})
    png = client.get(f"/v1/checks/{job['id']}/trajectory.png")
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content.startswith(b"\x89PNG\r\n\x1a\n")
    svg = client.get(f"/v1/checks/{job['id']}/trajectory.svg")
    assert svg.headers["content-type"] == "image/svg+xml" and b"set_epoch_missing" in svg.content


def test_a_resume_check_is_drawn_with_its_resume_step(client: TestClient) -> None:
    resume = {"at_step": 2, "data_parallel_size": 1}
    job = succeeded(client, {"plan": PLAN, "steps": 4, "resume": resume})
    assert job["result"]["resume"]["at_step"] == 2
    svg = client.get(f"/v1/checks/{job['id']}/trajectory.svg")
    assert svg.status_code == 200 and b"resumed at step 2: 2 -&gt; 1 replicas" in svg.content


def test_the_documented_problems_are_what_the_route_answers(client: TestClient, runner: RunRunner) -> None:
    not_found, conflict = _problems(client, "404"), _problems(client, "409")
    example_id = not_found["unknown_id"]["detail"].split("'")[1]
    assert client.get(f"/v1/checks/{example_id}/trajectory.png").json() == not_found["unknown_id"]
    one = succeeded(client, {"plan": PLAN})
    answer = client.get(f"/v1/checks/{one['id']}/trajectory.png")
    assert answer.status_code == 404
    assert answer.json() == {
        **not_found["one_step"],
        "detail": not_found["one_step"]["detail"].replace(example_id, one["id"]),
    }
    with held_running(client, runner, {"plan": PLAN, "steps": 4}) as held:
        answer = client.get(f"/v1/checks/{held}/trajectory.svg")
        assert answer.status_code == 409
        assert answer.json() == {
            **conflict["running"],
            "detail": conflict["running"]["detail"].replace(example_id, held),
        }
