"""The check service's side of /v1/checks on a fake runner: queueing, recording, cancel,
admission and shutdown, without torch or rank processes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.apps import runner_client
from support.fake_runner import FakeRunner

from app.api.checks import HOLD_S
from app.contract.codec import decode, encode
from app.contract.spec import CheckSpec
from app.main import create_app
from app.settings import Settings
from app.worker.service.runner import RankError

EVEN_2 = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}


@pytest.fixture
def runner() -> FakeRunner:
    return FakeRunner()


@pytest.fixture
def client(tmp_path: Path, runner: FakeRunner) -> Iterator[TestClient]:
    yield from runner_client(tmp_path, runner)


def wait_status(client: TestClient, location: str, *statuses: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while (job := client.get(location).json())["status"] not in statuses:
        assert time.monotonic() < deadline, f"job stuck: {job}"
        time.sleep(0.01)
    return job  # type: ignore[no-any-return]


def test_a_check_runs_on_the_runner_and_its_result_is_recorded(
    client: TestClient, runner: FakeRunner
) -> None:
    assert runner.started
    response = client.post("/v1/checks", json={"plan": EVEN_2, "timeout_s": 30})
    assert response.status_code == 202, response.text
    job = wait_status(client, response.headers["location"], "succeeded")
    assert job["result"]["passed"] is True and job["error"] is None
    assert set(job["result"]["timings_s"]) >= {"check", "queued", "end_to_end"}
    assert job["request"]["plan"]["global_batch_size"] == 16
    (order,) = runner.orders
    assert order.job_id == job["id"] and order.timeout_s == 30 and order.rendezvous is None
    assert order.model_target is None  # the built-in model
    # What the ranks receive: the spec through JSON, as the job store and the pipe carry it.
    assert decode(CheckSpec, json.loads(json.dumps(encode(order.spec)))) == order.spec
    assert order.spec.data_parallel_size == 2
    host = client.get("/v1/host").json()
    assert host["ready"] and host["warm_processes"] == 2 and host["torch_version"] == "fake"


def test_a_rendezvous_host_outside_the_allow_list_never_reaches_the_runner(
    client: TestClient, runner: FakeRunner
) -> None:
    body = {"plan": EVEN_2, "rendezvous": {"endpoint": "10.0.0.1:29400", "nnodes": 2, "run_id": "probe"}}
    response = client.post("/v1/checks", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["pointer"] == "/rendezvous/endpoint"
    assert client.get("/v1/checks").json()["checks"] == [] and runner.orders == []


def test_plan_errors_point_under_plan(client: TestClient) -> None:
    response = client.post("/v1/checks", json={"plan": {**EVEN_2, "global_batch_size": 15}})
    assert response.status_code == 422, response.text
    errors = response.json()["errors"]
    assert errors and all(e["pointer"].startswith("/plan/") for e in errors), errors


def test_cancel_a_running_check_then_a_conflict(client: TestClient, runner: FakeRunner) -> None:
    runner.gate = client.portal.call(_event)  # type: ignore[union-attr]  # set only inside `with`
    location = client.post("/v1/checks", json={"plan": EVEN_2}).headers["location"]
    wait_status(client, location, "running")
    cancelled = client.delete(location)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    again = client.delete(location)
    assert again.status_code == 409 and "already cancelled" in again.json()["detail"]


def test_a_runner_error_fails_the_check_with_its_reason(client: TestClient, runner: FakeRunner) -> None:
    runner.error = RankError("rank 1 fell over")
    location = client.post("/v1/checks", json={"plan": EVEN_2}).headers["location"]
    job = wait_status(client, location, "failed")
    assert job["error"].startswith("rank 1 fell over") and job["result"] is None


def test_the_shutdown_stops_the_runner(tmp_path: Path, runner: FakeRunner) -> None:
    settings = Settings(jobs_db=tmp_path / "jobs.sqlite3", log_level="warning")
    with TestClient(create_app(settings, runner=runner)):
        assert runner.started and not runner.stopped
    assert runner.stopped


async def _event() -> asyncio.Event:
    """An event made on the app's event loop."""
    return asyncio.Event()


def test_the_shuffled_dataset_limit_is_the_operators_setting(tmp_path: Path, runner: FakeRunner) -> None:
    settings = Settings(jobs_db=tmp_path / "jobs.sqlite3", log_level="warning", max_shuffled_samples=100)
    with TestClient(create_app(settings, runner=runner)) as client:
        shuffled = {**EVEN_2, "dataset": {"num_samples": 101, "shuffle": True}}
        refused = client.post("/v1/checks", json={"plan": shuffled})
        assert refused.status_code == 422, refused.text
        assert refused.json()["errors"][0]["pointer"] == "/plan/dataset/num_samples"
        # Keyed as every suggestion is, by the field's path within the plan (CONTRACT.md).
        assert refused.json()["suggestions"] == {"dataset.num_samples": [100]}
        # The same size unshuffled is only indexed: no limit applies.
        unshuffled = {**EVEN_2, "dataset": {"num_samples": 101, "shuffle": False}}
        assert client.post("/v1/checks", json={"plan": unshuffled}).status_code == 202


def test_the_job_says_which_workload_runs_where_the_plan_chose_it(
    client: TestClient, runner: FakeRunner
) -> None:
    """A token-normalised plan runs the tokens workload without being asked: the job's request
    says so (a null would leave the reader guessing), as does what the ranks receive."""
    tokens = {
        "topology": {"num_nodes": 1, "gpus_per_node": 2},
        "sequence_length": 16,
        "global_batch_tokens": 128,
        "loss_normalization": "token",
    }
    for plan, asked, runs in (
        (tokens, None, "tokens"),
        (EVEN_2, None, "synthetic"),
        (tokens, "synthetic", "synthetic"),
    ):
        body = {"plan": plan} if asked is None else {"plan": plan, "workload": asked}
        response = client.post("/v1/checks", json=body)
        assert response.status_code == 202, response.text
        assert response.json()["request"]["workload"] == runs
        job = wait_status(client, response.headers["location"], "succeeded")
        assert job["request"]["workload"] == runs
        assert runner.orders[-1].spec.workload == runs


def test_a_get_that_waits_answers_when_the_check_finishes(client: TestClient, runner: FakeRunner) -> None:
    """?wait= holds the answer until the check is recorded finished, instead of the caller
    asking again every few milliseconds; past its time it answers with the status then."""
    gate = runner.gate = client.portal.call(_event)  # type: ignore[union-attr]  # set only inside `with`
    location = client.post("/v1/checks", json={"plan": EVEN_2}).headers["location"]
    wait_status(client, location, "running")
    # Without ?wait an unfinished check is answered within HOLD_S; ?wait=0 answers at once.
    started = time.monotonic()
    assert client.get(location).json()["status"] == "running"
    assert time.monotonic() - started >= HOLD_S
    assert client.get(location, params={"wait": 0}).json()["status"] == "running"
    started = time.monotonic()
    still = client.get(location, params={"wait": 0.3})
    assert still.status_code == 200 and still.json()["status"] == "running"
    assert time.monotonic() - started >= 0.3
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(client.get, location, params={"wait": 30})
        time.sleep(0.2)
        assert not waiting.done()
        started = time.monotonic()
        client.portal.call(gate.set)  # type: ignore[union-attr]
        answer = waiting.result(timeout=10)
    assert answer.status_code == 200 and answer.json()["status"] == "succeeded", answer.text
    assert answer.json()["result"]["passed"] is True
    assert time.monotonic() - started < 10  # woken by the finish, not by its 30 s
    # A finished check answers at once, and so does one that does not exist.
    started = time.monotonic()
    assert client.get(location, params={"wait": 30}).json()["status"] == "succeeded"
    assert client.get("/v1/checks/" + "0" * 32, params={"wait": 30}).status_code == 404
    assert time.monotonic() - started < 10
    # Nothing is left waiting: no event stays behind for a finished or a missing job.
    assert client.app.state.checks.waited_for() == 0  # type: ignore[attr-defined]


def test_cancelling_a_queued_check_wakes_a_get_that_waits(client: TestClient, runner: FakeRunner) -> None:
    runner.gate = client.portal.call(_event)  # type: ignore[union-attr]  # set only inside `with`
    running = client.post("/v1/checks", json={"plan": EVEN_2}).headers["location"]
    wait_status(client, running, "running")
    queued = client.post("/v1/checks", json={"plan": EVEN_2}).headers["location"]
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(client.get, queued, params={"wait": 30})
        time.sleep(0.2)
        assert client.delete(queued).json()["status"] == "cancelled"
        answer = waiting.result(timeout=10)
    assert answer.json()["status"] == "cancelled"
    assert client.delete(running).status_code == 200


@pytest.mark.parametrize(("wait", "nearest"), [(61, 60), (-1, 0)])
def test_a_wait_out_of_range_is_a_422_naming_it(client: TestClient, wait: float, nearest: int) -> None:
    location = client.post("/v1/checks", json={"plan": EVEN_2}).headers["location"]
    refused = client.get(location, params={"wait": wait})
    assert refused.status_code == 422, refused.text
    body = refused.json()  # a query parameter is pointed at as every other is
    assert body["errors"][0]["pointer"] == "/query/wait" and str(nearest) in body["errors"][0]["detail"]
