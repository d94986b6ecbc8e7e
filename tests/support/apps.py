"""The app in-process (a TestClient) with the worker's rank processes warm, for the tests that
run real checks without a server subprocess, or with a fake runner."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

from .fake_runner import FakeRunner
from .polling import wait_warm


@contextlib.contextmanager
def warm_app(
    db: Path, processes: int, *, models: bool = False, timeout: float = 90, **settings: Any
) -> Iterator[TestClient]:
    """A TestClient over the app with `processes` warm ranks, jobs in `db` and the other
    `settings`; with `models`, once every registered model was built."""
    app = create_app(Settings(jobs_db=db, processes_per_host=processes, **settings))
    with TestClient(app, raise_server_exceptions=False) as client:
        wait_warm(client, processes, models=models, timeout=timeout)
        yield client


def warm_client(
    tmp_path_factory: pytest.TempPathFactory, processes: int, **settings: Any
) -> Iterator[TestClient]:
    """A module's client fixture over warm ranks, its jobs in a fresh database:
    `yield from warm_client(tmp_path_factory, 4, check_models=...)`."""
    db = tmp_path_factory.mktemp("jobs") / "jobs.sqlite3"
    with warm_app(db, processes, **settings) as client:
        yield client


def fake_client(
    tmp_path_factory: pytest.TempPathFactory, runner: FakeRunner | None = None, **settings: Any
) -> Iterator[TestClient]:
    """A module's client fixture whose checks run on a fake runner (no torch, no processes)."""
    db = tmp_path_factory.mktemp("jobs") / "jobs.sqlite3"
    app = create_app(Settings(jobs_db=db, log_level="warning", **settings), runner=runner or FakeRunner())
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def runner_client(tmp_path: Path, runner: FakeRunner) -> Iterator[TestClient]:
    """A test's client fixture whose checks run on `runner`, its jobs in `tmp_path`, server errors
    raised: `yield from runner_client(tmp_path, runner)`."""
    settings = Settings(jobs_db=tmp_path / "jobs.sqlite3", log_level="warning")
    with TestClient(create_app(settings, runner=runner)) as client:
        yield client


@contextlib.contextmanager
def held_running(client: TestClient, runner: FakeRunner, body: dict[str, Any]) -> Iterator[str]:
    """The id of a check of `body` that stays running (the runner's gate shut) while the block
    runs; cancelled after it."""
    runner.gate = asyncio.Event()
    held = client.post("/v1/checks", json=body).json()["id"]
    try:
        for _ in range(500):
            if client.get(f"/v1/checks/{held}").json()["status"] == "running":
                break
            time.sleep(0.01)
        yield held
    finally:
        assert client.delete(f"/v1/checks/{held}").status_code == 200
        runner.gate = None


def wait_job(
    client: TestClient, location: str, status: str | None = None, timeout: float = 10
) -> dict[str, Any]:
    """The job at `location` once its status is `status` (default: once it is finished, neither
    queued nor running)."""
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = client.get(location).json()
        if job["status"] == status or (status is None and job["status"] not in ("queued", "running")):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.01)


def succeeded(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    """The job of a check of `body`, submitted and waited for until it succeeded."""
    response = client.post("/v1/checks", json=body)
    assert response.status_code == 202, response.text
    return wait_job(client, response.headers["location"], "succeeded")


def documented_problems(client: TestClient, path: str, status: str) -> dict[str, Any]:
    """The problem examples the OpenAPI document gives for GET `path`'s `status`, by name."""
    responses = client.get("/openapi.json").json()["paths"][path]["get"]["responses"]
    examples = responses[status]["content"]["application/problem+json"]["examples"]
    return {name: e["value"] for name, e in examples.items()}
