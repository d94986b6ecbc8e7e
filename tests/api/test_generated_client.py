"""A client generated from the OpenAPI document, as job-submission tooling generates one (issue 40,
item 12): openapi-python-client (the dev extra) writes it from the app's own document, its
functions carry the operations' clean ids (`create_plan`, `get_check`, `cancel_check`), and it
plans, checks and reads a typed problem end to end against a real server with warm ranks.
Every answer it parses is held to the server's own JSON for the same request."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.servers import Server, serve, worker_env

from app.main import create_app
from app.settings import Settings

pytest.importorskip("openapi_python_client", reason="pip install -e '.[dev]' (openapi-python-client)")

PACKAGE = "batchplan_generated_client"
PLAN = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16, "micro_batch_size": 4}
INFEASIBLE = {**PLAN, "global_batch_size": 15}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The client package, generated from the document the app serves and imported."""
    out = tmp_path_factory.mktemp("generated")
    with TestClient(create_app(Settings(worker_enabled=False, log_level="warning"))) as app:
        (out / "openapi.json").write_bytes(app.get("/openapi.json").content)
    generator = Path(sys.executable).with_name("openapi-python-client")
    env = {**os.environ, "PATH": f"{generator.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    argv = [str(generator), "generate", "--path", str(out / "openapi.json"), "--meta", "none"]
    done = subprocess.run(
        [*argv, "--output-path", str(out / PACKAGE)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(out))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("server")
    env = {**worker_env(tmp / "jobs.sqlite3", 2), "CUDA_VISIBLE_DEVICES": ""}
    with serve(env, tmp / "server.log") as running:
        running.wait_warm(2)
        yield running


def _api(generated: ModuleType, module: str) -> Any:
    return importlib.import_module(f"{PACKAGE}.api.{module}")


def _model(generated: ModuleType, name: str) -> Any:
    return getattr(importlib.import_module(f"{PACKAGE}.models"), name)


def test_the_functions_are_named_by_the_operation_ids(generated: ModuleType) -> None:
    root = Path(generated.__file__).parent / "api"
    functions = {p.stem for p in root.glob("*/*.py") if p.stem != "__init__"}
    wanted = {"create_plan", "export_plan", "create_check", "get_check", "cancel_check", "list_checks"}
    assert wanted <= functions
    assert not [f for f in functions if f.endswith(("_get", "_post", "_delete"))]


def test_a_generated_client_plans_and_reads_a_typed_problem(generated: ModuleType, server: Server) -> None:
    client = generated.Client(base_url=server.url, raise_on_unexpected_status=True)
    create_plan = _api(generated, "plans.create_plan")
    request = _model(generated, "PlanRequestIn").from_dict(PLAN)
    answer = create_plan.sync_detailed(client=client, body=request)
    assert answer.status_code == 200
    assert answer.parsed.to_dict() == server.client.post("/v1/plans", json=PLAN).json()
    assert isinstance(answer.parsed, _model(generated, "PlanOut"))

    infeasible = _model(generated, "PlanRequestIn").from_dict(INFEASIBLE)
    refused = create_plan.sync_detailed(client=client, body=infeasible)
    problem = refused.parsed
    assert refused.status_code == 422 and isinstance(problem, _model(generated, "ProblemOut"))
    served = server.client.post("/v1/plans", json=INFEASIBLE).json()
    assert problem.to_dict() == served
    assert problem.suggestions.to_dict() == served["suggestions"]


def test_a_generated_client_runs_a_check_and_cancels_one(generated: ModuleType, server: Server) -> None:
    client = generated.Client(base_url=server.url, raise_on_unexpected_status=True, timeout=None)
    create_check = _api(generated, "checks.create_check")
    get_check = _api(generated, "checks.get_check")
    cancel_check = _api(generated, "checks.cancel_check")
    body = _model(generated, "CheckRequestIn").from_dict({"plan": PLAN, "dtype": "float64"})
    submitted = create_check.sync_detailed(client=client, body=body)
    assert submitted.status_code == 202
    job_id = submitted.parsed.id
    done = get_check.sync(job_id, client=client, wait=30)
    assert done.status == "succeeded" and done.result.passed is True
    assert done.to_dict() == server.client.get(f"/v1/checks/{job_id}").json()
    # A finished check cannot be cancelled: the typed problem says so, as the server does.
    cancelled = cancel_check.sync_detailed(job_id, client=client)
    served = server.client.delete(f"/v1/checks/{job_id}")
    assert cancelled.status_code == served.status_code
    assert json.loads(cancelled.content) == served.json()
    if cancelled.status_code >= 400:
        assert isinstance(cancelled.parsed, _model(generated, "ProblemOut"))
    listed = _api(generated, "checks.list_checks").sync(client=client)
    assert job_id in json.dumps(
        listed.to_dict() if hasattr(listed, "to_dict") else [j.to_dict() for j in listed]
    )
