"""Shared fixtures: an app without the worker and a TestClient over it (light), and one
default worker app with warm ranks for the modules that need nothing else (not light).

The web stack is imported inside the fixtures, so the pure core tests never depend on it.
support/parallel.py keeps the tests that share a module or session fixture on one
pytest-xdist worker, and says what a test must do to run beside any other.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

pytest_plugins = ("support.parallel",)

# Four xdist workers share two cores, and torch in each of them (and in the processes they
# start) would run a thread per core: one intra-op thread each keeps them from competing for
# cores they do not have. Set before any test imports torch; a test that wants more sets it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

if TYPE_CHECKING:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from app.settings import Settings


@pytest.fixture
def settings() -> Settings:
    from app.settings import Settings

    return Settings(worker_enabled=False)


@pytest.fixture
def app(settings: Settings) -> FastAPI:
    from app.main import create_app

    return create_app(settings)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    from fastapi.testclient import TestClient

    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture(scope="session")
def default_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The app as a server started with no settings runs it: 4 warm ranks, the default check
    models built. Only its job database and a quiet log are the tests' own; the modules that
    use it share it (its ranks start once), so a test must not depend on which jobs it holds."""
    from support.apps import warm_app

    db = tmp_path_factory.mktemp("jobs") / "jobs.sqlite3"
    with warm_app(db, 4, models=True, log_level="warning") as test_client:
        yield test_client
