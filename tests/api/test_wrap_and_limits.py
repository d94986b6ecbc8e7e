"""Two more answers that say what to send (issue 40, item 5): a bare plan posted where a plan is
wrapped (`/v1/checks`, `/v1/plans/schedule`) is told to wrap it as `{"plan": ...}`, not given
"/plan: Field required" and one "Extra inputs" per plan field; a body over the limit names the
setting that raises it, and that setting does."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from support.fake_runner import FakeRunner

from app.main import create_app
from app.settings import Settings

PLAN = {
    "topology": {"num_nodes": 1, "gpus_per_node": 2},
    "global_batch_size": 8,
    "dataset": {"num_samples": 64},
}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = Settings(jobs_db=tmp_path_factory.mktemp("jobs") / "jobs.sqlite3", log_level="warning")
    with TestClient(create_app(settings, runner=FakeRunner()), raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.mark.parametrize(
    ("url", "extra"), [("/v1/checks", {"steps": 2}), ("/v1/plans/schedule", {"train_steps": 100})]
)
def test_a_bare_plan_is_told_to_wrap_it(client: TestClient, url: str, extra: dict[str, int]) -> None:
    response = client.post(url, json={**PLAN, **extra})
    assert response.status_code == 422
    problem = response.json()
    assert problem["errors"] == [{"pointer": "/plan", "detail": problem["errors"][0]["detail"]}], problem
    assert 'wrap it as {"plan": ...}' in problem["detail"]
    assert problem["detail"].startswith("/plan: ")
    # Wrapped as it says, the same fields are a valid request.
    wrapped = {"plan": PLAN, **extra}
    assert 200 <= client.post(url, json=wrapped).status_code < 300


def test_a_bare_plan_with_a_field_of_neither_keeps_that_error(client: TestClient) -> None:
    problem = client.post("/v1/checks", json={**PLAN, "colour": "blue"}).json()
    assert [e["pointer"] for e in problem["errors"]] == ["/plan", "/colour"]


def test_a_plan_that_is_wrapped_but_wrong_is_not_told_to_wrap_it(client: TestClient) -> None:
    problem = client.post("/v1/checks", json={"plan": {**PLAN, "global_batch_size": 0}}).json()
    assert "wrap" not in json.dumps(problem)


def test_a_body_over_the_limit_names_the_setting_that_raises_it(monkeypatch: pytest.MonkeyPatch) -> None:
    limit = 4096
    body = json.dumps(PLAN).encode() + b" " * limit
    with TestClient(create_app(Settings(max_body_bytes=limit, worker_enabled=False))) as small:
        response = small.post("/v1/plans", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 413
    named = re.search(r"\b(BATCHPLAN_[A-Z_]+)=(\d+)", response.json()["detail"])
    assert named, response.json()
    variable, limit_said = named.groups()
    assert int(limit_said) == limit
    # The variable named is the one the server reads: set above this body's size, it serves it.
    monkeypatch.setenv(variable, str(len(body)))
    with TestClient(create_app(Settings(worker_enabled=False))) as larger:
        response = larger.post("/v1/plans", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200
