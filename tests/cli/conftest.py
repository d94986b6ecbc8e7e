"""Real servers for the CLI tests: uvicorn subprocesses on free loopback ports.

`server`: the planner only (BATCHPLAN_WORKER_ENABLED=false). `worker_server`: with the
gradient-check worker (2 warm gloo ranks) and an API key. Each is started once per module
that uses it and always stopped with its whole process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import API_KEY, HOST, ROOT, Invoke, Run, Server, free_port
from typer.testing import CliRunner

from app.cli import cli


def _get(url: str, api_key: str | None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server alone, so that it stops its worker itself; then end whatever it
    started that outlived it (its session's process group)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    deadline = time.monotonic() + 5
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def _serve(tmp: Path, env: dict[str, str], ready_path: str, limit_s: float) -> Iterator[Server]:
    port = free_port()
    log = tmp / "server.log"
    api_key = env.get("BATCHPLAN_API_KEY")
    full_env = {**os.environ, "BATCHPLAN_LOG_FORMAT": "console", "BATCHPLAN_LOG_LEVEL": "warning", **env}
    argv = [sys.executable, "-m", "uvicorn", "app.main:app", "--host", HOST, "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        url = f"http://{HOST}:{port}"
        deadline = time.monotonic() + limit_s
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                status, body = _get(url + ready_path, api_key)
                if status == 200 and (ready_path != "/v1/host" or json.loads(body).get("ready")):
                    break
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{ready_path} not ready within {limit_s:.0f} s:\n{log.read_text()[-3000:]}"
                )
            time.sleep(0.05)
        yield Server(url, log, api_key)
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The planner only: the worker endpoints answer 503."""
    tmp = tmp_path_factory.mktemp("server")
    env = {"BATCHPLAN_WORKER_ENABLED": "false", "BATCHPLAN_JOBS_DB": str(tmp / "jobs.sqlite3")}
    with _serve(tmp, env, "/livez", 30) as running:
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
    with _serve(tmp, env, "/v1/host", 60) as running:
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
