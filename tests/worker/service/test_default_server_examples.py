"""Swagger's "Try it out" on a server started with no settings (issue 25): every check example
the OpenAPI document shows runs on real warm ranks and passes, the registered-model example
included, since a default server registers the example model."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from fastapi.testclient import TestClient
from support.polling import run_check

from app.contract.model_registry import EXAMPLE_MODELS, parse_models

pytestmark = pytest.mark.slow


@pytest.fixture
def client(default_worker: TestClient) -> TestClient:
    # tests/conftest.py: its own job database, 4 ranks, a quiet log, the default check models.
    return default_worker


def _check_examples(client: TestClient) -> dict[str, Any]:
    operation = client.get("/openapi.json").json()["paths"]["/v1/checks"]["post"]
    examples = operation["requestBody"]["content"]["application/json"]["examples"]
    return {name: example["value"] for name, example in examples.items()}


def test_the_default_server_lists_the_example_model_built(client: TestClient) -> None:
    models = {m["name"]: m for m in client.get("/v1/check-models").json()["models"]}
    assert set(parse_models(EXAMPLE_MODELS)) <= set(models)
    assert all(models[name]["loaded"] for name in parse_models(EXAMPLE_MODELS)), models


def test_every_check_example_runs_and_passes_on_a_default_server(client: TestClient) -> None:
    examples = _check_examples(client)
    assert "registered_model" in examples
    for name, body in examples.items():
        job = run_check(client, body, timeout=180)
        assert job["status"] == "succeeded", (name, job)
        assert job["result"]["passed"], (name, job["result"])
