"""Health, readiness, metrics and the docs page."""

from __future__ import annotations

from fastapi.testclient import TestClient


def test_livez_is_ok(client: TestClient) -> None:
    response = client.get("/livez")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_readyz_is_ready_without_the_worker(client: TestClient) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["status"] == "ready"


def test_metrics_are_prometheus_text_and_count_plan_requests(client: TestClient) -> None:
    client.post("/v1/plans", json={"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 4})
    client.post("/v1/plans", json={"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 3})
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert "# TYPE" in text
    plan_lines = [line for line in text.splitlines() if "/v1/plans" in line and not line.startswith("#")]
    assert any('"200"' in line or "200" in line for line in plan_lines)
    assert any("422" in line for line in plan_lines)


def test_every_response_carries_a_request_id(client: TestClient) -> None:
    assert client.get("/livez").headers.get("x-request-id")
    given = client.get("/livez", headers={"x-request-id": "abc-123"})
    assert given.headers["x-request-id"] == "abc-123"


def test_swagger_ui_is_served(client: TestClient) -> None:
    response = client.get("/docs")
    assert response.status_code == 200
    assert "swagger" in response.text.lower()
