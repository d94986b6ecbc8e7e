"""The OpenAPI document as tooling meets it (issue 40, item 12): every operation has a clean, stable
`operationId` (what generated clients name their functions after: `create_plan`, not FastAPI's
default `create_plan_v1_plans_post`), and the document's links name operations that exist.
tests/api/test_generated_client.py generates a client from it and calls it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

# The ids clients are generated with: renaming one breaks their code (CHANGELOG.md says when).
OPERATION_IDS = {
    ("post", "/v1/plans"): "create_plan",
    ("post", "/v1/plans/export/{format}"): "export_plan",
    ("post", "/v1/plans/schedule"): "plan_schedule",
    ("post", "/v1/plans/elastic"): "plan_elastic",
    ("post", "/v1/checks"): "create_check",
    ("get", "/v1/checks"): "list_checks",
    ("get", "/v1/checks/{check_id}"): "get_check",
    ("delete", "/v1/checks/{check_id}"): "cancel_check",
    ("get", "/v1/checks/{check_id}/trajectory.{format}"): "get_check_trajectory",
    ("get", "/v1/checks/{check_id}/throughput.{format}"): "get_check_throughput",
    ("get", "/v1/checks/{check_id}/lr_scaling.{format}"): "get_check_lr_scaling",
    ("get", "/v1/check-models"): "list_check_models",
    ("get", "/v1/host"): "get_host",
    ("get", "/livez"): "livez",
    ("get", "/readyz"): "readyz",
    ("get", "/metrics"): "metrics",
}


@pytest.fixture(scope="module")
def document() -> Iterator[dict[str, Any]]:
    with TestClient(create_app(Settings(worker_enabled=False, log_level="warning"))) as client:
        yield client.get("/openapi.json").json()


def _operations(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(method, path): op for path, ops in document["paths"].items() for method, op in ops.items()}


def test_every_operation_has_its_clean_stable_id(document: dict[str, Any]) -> None:
    ids = {key: op["operationId"] for key, op in _operations(document).items()}
    assert ids == OPERATION_IDS
    assert len(set(ids.values())) == len(ids)
    assert all(i.isidentifier() and i == i.lower() for i in ids.values())


def test_every_link_names_an_operation_that_exists(document: dict[str, Any]) -> None:
    ids = {op["operationId"] for op in _operations(document).values()}
    links = [
        link
        for op in _operations(document).values()
        for response in op.get("responses", {}).values()
        for link in response.get("links", {}).values()
    ]
    assert len(links) >= 2
    assert {link["operationId"] for link in links} <= ids
