"""Shared helpers of the reliability suite."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from support.fake_runner import FakeRunner


@pytest.fixture(scope="module")
def queued_only_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The app with a check service that accepts and stores jobs but never runs them:
    no rank process starts, so hostile check requests cannot allocate anything. One per
    module: its tests refuse requests before anything is stored and assert that nothing was,
    so each finds it as the last one left it, empty; a new app per test only cost CPU."""
    tmp_path = tmp_path_factory.mktemp("queued_only")
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings
    from app.worker.service.limits import Limits
    from app.worker.service.service import CheckService

    settings = Settings(worker_enabled=False, log_level="warning")
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        limits = dataclasses.replace(
            Limits.from_settings(settings), processes_per_host=1, queue_size=4, concurrent_checks=1
        )
        # Never started: jobs are admitted and stored, and the runner never sees them.
        service = CheckService(tmp_path / "jobs.sqlite3", limits, runner=FakeRunner(size=1))
        client.app.state.checks = service  # type: ignore[attr-defined]
        try:
            yield client
        finally:
            client.app.state.checks = None  # type: ignore[attr-defined]
            service.store.close()
