"""Swagger's finished checks (GET /v1/checks/{id}): real answers (tests/support/finished_checks.py
writes them from real checks), each read by the response model and showing its kind's part."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.schemas.checks import CheckJobOut
from app.schemas.finished_checks import FINISHED_CHECKS


@pytest.mark.parametrize("name", ["resume", "throughput", "lr_scaling"])
def test_a_finished_example_is_a_real_answer_of_its_kind(name: str) -> None:
    job = FINISHED_CHECKS[name]["value"]
    read = CheckJobOut.model_validate(job)
    assert read.status == "succeeded" and read.result is not None and read.result.passed
    assert job["result"][name] is not None
    assert "string" not in repr(job).replace("'", " ").split()  # no schema placeholder


def test_swagger_shows_them_on_get_check(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    shown = spec["paths"]["/v1/checks/{check_id}"]["get"]["responses"]["200"]["content"]["application/json"]
    assert set(shown["examples"]) == set(FINISHED_CHECKS)
