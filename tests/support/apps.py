"""The app in-process (a TestClient) with the worker's rank processes warm, for the tests that
run real checks without a server subprocess, or with a fake runner."""

from __future__ import annotations

import contextlib
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
