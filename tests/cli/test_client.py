"""BatchplanClient: the real app in-process (TestClient is an httpx.Client) for the planner
endpoints, and httpx.MockTransport only for what the app cannot be made to answer on demand
(a 429 with Retry-After, a proxy's HTML error page)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from app.client import BatchplanClient, ProblemError, UnreachableError
from app.main import create_app
from app.schemas.elastic import ELASTIC_REQUEST_EXAMPLE
from app.settings import Settings

BODY = {"topology": {"num_nodes": 2, "gpus_per_node": 8}, "global_batch_size": 512}


@pytest.fixture(scope="module")
def client() -> Iterator[BatchplanClient]:
    app = create_app(Settings(worker_enabled=False, api_key="k", protect_planner=False))
    with (
        TestClient(app, raise_server_exceptions=False) as http,
        BatchplanClient("http://testserver", api_key="k", http_client=http) as batchplan,
    ):
        yield batchplan


def test_plan_and_problem(client: BatchplanClient) -> None:
    assert client.plan(BODY)["micro_batch_size"] == 32
    with pytest.raises(ProblemError) as caught:
        client.plan({**BODY, "global_batch_size": 1000, "micro_batch_size": 32})
    err = caught.value
    assert err.status == 422
    assert err.problem["type"] == "urn:batchplan:problem:infeasible-plan"
    assert err.detail.startswith("global_batch_size 1000 is not a multiple")
    assert err.errors[0]["pointer"] == "/global_batch_size"
    assert err.suggestions == {"global_batch_size": [1024, 512, 1536]}
    assert err.retry_after is None


def test_export_with_options(client: BatchplanClient) -> None:
    text = client.export("slurm", BODY, job_name="resnet", port=29600, script="main.py")
    assert "resnet" in text and "29600" in text and "main.py" in text
    with pytest.raises(ProblemError) as caught:
        client.export("ray", BODY)
    assert caught.value.status == 404 and "known formats" in caught.value.detail
    with pytest.raises(ProblemError) as odd:
        client.export("a/b", BODY)  # one path segment, percent-encoded
    assert odd.value.status == 404


def test_schedule_and_elastic(client: BatchplanClient) -> None:
    body = {"plan": BODY, "train_steps": 100, "max_points": 10}
    series = client.schedule(body)
    assert series["train_steps"] == 100 and len(series["points"]) <= 10
    svg = client.schedule(body, format="svg")
    assert svg.lstrip().startswith(b"<?xml") or b"<svg" in svg[:500]
    elastic = client.elastic(ELASTIC_REQUEST_EXAMPLE)
    assert elastic["global_batch_size"] <= ELASTIC_REQUEST_EXAMPLE["max_global_batch_size"]


def test_worker_endpoints_without_a_worker(client: BatchplanClient) -> None:
    assert client.host()["worker_enabled"] is False
    with pytest.raises(ProblemError) as caught:
        client.submit_check({"plan": BODY})
    assert caught.value.status == 503 and "worker is disabled" in caught.value.detail


def test_the_api_key_is_a_bearer_token() -> None:
    app = create_app(Settings(worker_enabled=False, api_key="k"))
    with TestClient(app) as http:
        with pytest.raises(ProblemError) as caught:
            BatchplanClient("http://testserver", http_client=http).host()
        assert caught.value.status == 401
        assert BatchplanClient("http://testserver", api_key="k", http_client=http).host()["ready"] is False


def test_retry_after_and_non_json_errors() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/checks":
            problem = {
                "type": "urn:batchplan:problem:http-429",
                "title": "Too many requests",
                "status": 429,
                "detail": "16 checks are already waiting; retry in about 3 s",
            }
            return httpx.Response(429, json=problem, headers={"Retry-After": "3"})
        return httpx.Response(502, text="<html>Bad Gateway</html>", headers={"content-type": "text/html"})

    with BatchplanClient("http://proxy", transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(ProblemError) as full:
            client.submit_check({"plan": BODY})
        assert full.value.status == 429 and full.value.retry_after == 3.0
        with pytest.raises(ProblemError) as gateway:
            client.plan(BODY)
        assert gateway.value.status == 502 and "Bad Gateway" in gateway.value.detail


def test_unreachable() -> None:
    from app.ports import free_port

    with (
        BatchplanClient(f"http://127.0.0.1:{free_port()}", timeout=5) as client,
        pytest.raises(UnreachableError),
    ):
        client.plan(BODY)
