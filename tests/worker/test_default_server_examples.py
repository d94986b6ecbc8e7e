"""Swagger's "Try it out" on a server started with no settings (issue 25): every check example
the OpenAPI document shows runs on real warm ranks and passes, the registered-model example
included, since a default server registers the example model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from fastapi.testclient import TestClient
from support.apps import warm_app
from support.polling import run_check

from app.core.model_registry import EXAMPLE_MODELS, parse_models

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    # Only what a test needs to run beside others: its own job database, its rank count and a
    # quiet log; the check models are the default ones.
    db = Path(tmp_path_factory.mktemp("jobs")) / "jobs.sqlite3"
    with warm_app(db, 4, models=True, log_level="warning") as test_client:
        yield test_client


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
