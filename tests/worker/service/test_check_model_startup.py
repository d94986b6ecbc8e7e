"""What a bad BATCHPLAN_CHECK_MODELS entry does, as docs/your-own-model.md says: a module that
is not installed stops start-up, naming the entry; right after start every registered model
is pending, and says so, until a rank has built it (tests/worker/service/test_check_models.py shows
the real probe's loaded and failed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from support.fake_runner import FakeRunner

from app.contract.host import BuiltModel
from app.contract.model_registry import EXAMPLE_MODELS
from app.main import create_app
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "your-own-model.md"
MISSING = "mlp=app.worker.example_models:mlp,resnet=no_such_pkg_here.models:resnet"


def test_an_entry_whose_module_is_not_installed_stops_start_up_naming_it() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(check_models=MISSING)
    assert (
        "BATCHPLAN_CHECK_MODELS: check model 'resnet' (no_such_pkg_here.models:resnet): no module named "
        "'no_such_pkg_here'" in str(refused.value)
    )
    # An installed module passes (the default registry), and without a worker the registry is
    # never used, so it is not held against the environment.
    assert Settings().model_registry == {"mlp": "app.worker.example_models:mlp"}
    assert Settings(worker_enabled=False, check_models=MISSING).model_registry["resnet"]


def test_the_server_itself_does_not_start(tmp_path: Path) -> None:
    """What `uvicorn app.main:app` does first: import the app, which reads the settings."""
    env = {**os.environ, "BATCHPLAN_CHECK_MODELS": MISSING, "BATCHPLAN_JOBS_DB": str(tmp_path / "j.sqlite3")}
    done = subprocess.run(
        [sys.executable, "-c", "import app.main"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "no module named 'no_such_pkg_here'" in done.stderr
    assert not (tmp_path / "j.sqlite3").exists()  # stopped before the worker took anything


def test_the_docs_example_with_a_package_that_is_not_here_stops_as_the_page_says() -> None:
    text = PAGE.read_text()
    registry = re.search(r'BATCHPLAN_CHECK_MODELS="([^"]+)"', text)
    said = re.search(r"^\s*Value error, (.+)$", text, re.MULTILINE)
    assert registry and said, "the page shows the registry and what start-up prints"
    with pytest.raises(ValidationError) as refused:
        Settings(check_models=registry.group(1))
    assert said.group(1) in str(refused.value)


def test_right_after_start_a_registered_model_is_pending_and_says_so(tmp_path: Path) -> None:
    runner = FakeRunner()  # its probe has not reported: what a real pool is for its first seconds
    settings = Settings(jobs_db=tmp_path / "jobs.sqlite3", log_level="warning", check_models=EXAMPLE_MODELS)
    with TestClient(create_app(settings, runner=runner)) as client:
        models = {m["name"]: m for m in client.get("/v1/check-models").json()["models"]}
        assert models["mlp"]["status"] == "pending" and models["mlp"]["loaded"] is None
        assert "building this model" in models["mlp"]["status_detail"]
        assert models["synthetic"]["status"] == "loaded" and models["synthetic"]["status_detail"] is None
        # What the probe then reports (the pool's models_info) is what the listing says.
        runner.models_info = {
            "mlp": BuiltModel("mlp", loaded=False, error="cannot import app.worker.example_models:nope")
        }
        (mlp,) = [m for m in client.get("/v1/check-models").json()["models"] if m["name"] == "mlp"]
        assert mlp["status"] == "failed" and mlp["status_detail"] is None and "cannot import" in mlp["error"]
        response = client.post(
            "/v1/checks",
            json={
                "plan": {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 8},
                "model": "mlp",
            },
        )
        assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/model"
