"""/metrics after real gloo checks: request, check and worker series, parsed as Prometheus text;
and the job id on every worker log line about a job (JSON logs)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from support.apps import warm_client
from support.installed import installed
from support.polling import FINISHED, hold_ranks, wait_check, wait_warm

from app.logging_setup import configure_logging
from app.settings import Settings

pytestmark = [pytest.mark.slow, installed("torch")]

EVEN_2 = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}


def scrape(client: TestClient) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """{family name: [(sample name, labels, value)]}."""
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        family.name: [(s.name, s.labels, s.value) for s in family.samples]
        for family in text_string_to_metric_families(response.text)
    }


def value(families: dict[str, Any], sample: str, **labels: str) -> float:
    family = families[max((name for name in families if sample.startswith(name)), key=len)]
    matches = [v for n, ls, v in family if n == sample and all(ls.get(k) == x for k, x in labels.items())]
    assert len(matches) == 1, (sample, labels, family)
    return float(matches[0])


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    try:
        settings = {"queue_size": 4, "check_timeout_s": 60, "log_format": "json", "log_level": "info"}
        yield from warm_client(tmp_path_factory, 2, timeout=60, **settings)
    finally:
        configure_logging(Settings(worker_enabled=False))


def test_metrics_after_a_real_check(client: TestClient) -> None:
    before = scrape(client)
    assert value(before, "batchplan_warm_ranks") == 2 and value(before, "batchplan_ranks_configured") == 2
    assert value(before, "batchplan_checks_queued") == 0 and value(before, "batchplan_checks_running") == 0
    passed_before = value(before, "batchplan_checks_total", status="succeeded", passed="true")

    response = client.post("/v1/checks", json={"plan": EVEN_2, "backend": "gloo"})
    job = wait_check(client, response.headers["location"], FINISHED)
    assert job["status"] == "succeeded" and job["result"]["passed"], job
    assert job["result"]["backend"] == "gloo" and job["result"]["processes"] == 2

    after = scrape(client)
    assert value(after, "batchplan_checks_total", status="succeeded", passed="true") == passed_before + 1
    assert value(after, "batchplan_checks_total", status="succeeded", passed="false") == 0
    assert value(after, "batchplan_check_duration_seconds_count", status="succeeded") >= 1
    assert 0 < value(after, "batchplan_check_duration_seconds_sum", status="succeeded") < 60
    assert value(after, "batchplan_check_duration_seconds_bucket", status="succeeded", le="+Inf") >= 1
    # requests by route template (not by path) and status, with a latency histogram
    assert value(after, "batchplan_http_requests_total", method="POST", route="/v1/checks", status="202") >= 1
    polled = value(
        after, "batchplan_http_requests_total", method="GET", route="/v1/checks/{check_id}", status="200"
    )
    assert polled >= 1
    assert (
        value(after, "batchplan_http_request_duration_seconds_count", method="POST", route="/v1/checks") >= 1
    )
    routes = {ls["route"] for _, ls, _ in after["batchplan_http_requests"]}
    assert not any(job["id"] in route for route in routes), routes


def test_queue_depth_running_and_cancelled_checks(client: TestClient) -> None:
    wait_warm(client, 2)
    running = hold_ranks(client, EVEN_2)  # holds both ranks
    waiting = client.post("/v1/checks", json={"plan": EVEN_2}).headers["location"]
    families = scrape(client)
    assert (
        value(families, "batchplan_checks_running") == 1 and value(families, "batchplan_checks_queued") == 1
    )
    assert value(families, "batchplan_busy_ranks") == 2
    cancelled_before = value(families, "batchplan_checks_total", status="cancelled", passed="none")

    assert client.delete(waiting).json()["status"] == "cancelled"  # never started: not counted as run
    assert client.delete(running).json()["status"] == "cancelled"
    families = scrape(client)
    assert (
        value(families, "batchplan_checks_total", status="cancelled", passed="none") == cancelled_before + 1
    )
    assert value(families, "batchplan_check_duration_seconds_count", status="cancelled") >= 1
    assert (
        value(families, "batchplan_checks_queued") == 0 and value(families, "batchplan_checks_running") == 0
    )
    wait_warm(client, 2)
    assert value(scrape(client), "batchplan_warm_ranks") == 2, "the cancelled check's ranks were replaced"


def test_unmatched_paths_do_not_add_series(client: TestClient) -> None:
    for i in range(30):
        assert client.get(f"/no/such/path/{i}").status_code == 404
        client.request(f"BREW{i}", "/v1/plans")
    families = scrape(client)
    labels = [ls for _, ls, _ in families["batchplan_http_requests"]]
    assert not any("/no/such" in ls["route"] for ls in labels)
    assert (
        value(families, "batchplan_http_requests_total", method="GET", route="unmatched", status="404") >= 30
    )
    methods = {ls["method"] for ls in labels}
    assert not any(m.startswith("BREW") for m in methods) and "OTHER" in methods, methods


def test_every_worker_line_about_a_job_carries_its_id(
    client: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    wait_warm(client, 2)
    capsys.readouterr()
    response = client.post("/v1/checks", json={"plan": EVEN_2})
    job_id = response.json()["id"]
    assert wait_check(client, response.headers["location"], FINISHED)["status"] == "succeeded"
    records = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.strip()]
    about = [r for r in records if r["logger"].startswith("batchplan.worker") and job_id in r["message"]]
    messages = {r["message"] for r in about}
    assert {f"check {job_id} queued", f"check {job_id} started", f"check {job_id} succeeded"} <= messages
    assert all(r.get("job_id") == job_id for r in about), about
    finished = next(r for r in about if r["message"] == f"check {job_id} succeeded")
    assert finished["passed"] is True and finished["status"] == "succeeded" and finished["duration_s"] > 0
    # request lines (access log) carry the request id, not a job id
    assert all("job_id" not in r for r in records if r["logger"] == "batchplan.access")
