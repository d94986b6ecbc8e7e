"""Real servers for the CLI tests: uvicorn subprocesses on free loopback ports.

`server`: the planner only (BATCHPLAN_WORKER_ENABLED=false). `worker_server`: with the
gradient-check worker (2 warm gloo ranks) and an API key. Each is started once per session
that uses it and always stopped with everything it started.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.cli import API_KEY, Invoke, Run
from support.servers import Server, serve
from typer.testing import CliRunner

from app.cli import cli


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The planner only: the worker endpoints answer 503."""
    tmp = tmp_path_factory.mktemp("server")
    env = {"BATCHPLAN_WORKER_ENABLED": "false", "BATCHPLAN_JOBS_DB": str(tmp / "jobs.sqlite3")}
    with serve(env, tmp / "server.log") as running:
        yield running


@pytest.fixture(scope="session")
def worker_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """With the worker: 2 warm gloo rank processes, the API key required."""
    tmp = tmp_path_factory.mktemp("worker")
    env = {
        "BATCHPLAN_WORKER_ENABLED": "true",
        "BATCHPLAN_PROCESSES_PER_HOST": "2",
        "BATCHPLAN_JOBS_DB": str(tmp / "jobs.sqlite3"),
        "BATCHPLAN_API_KEY": API_KEY,
        "CUDA_VISIBLE_DEVICES": "",
    }
    with serve(env, tmp / "server.log") as running:
        running.wait_warm(2, timeout=60)
        yield running


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch) -> Iterator[Invoke]:
    """`run(*args)`: the CLI in-process (CliRunner), stdout and stderr apart."""
    monkeypatch.delenv("BATCHPLAN_API_KEY", raising=False)
    runner = CliRunner()

    def invoke(*args: str, env: dict[str, str] | None = None) -> Run:
        result = runner.invoke(cli, list(args), env=env, catch_exceptions=False)
        return Run(result.exit_code, result.stdout, result.stderr)

    yield invoke
