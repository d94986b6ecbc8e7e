"""Shared helpers of the reliability suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def queued_only_client(tmp_path: Path) -> Iterator[object]:
    """The app with a check service that accepts and stores jobs but never runs them:
    no rank process starts, so hostile check requests cannot allocate anything."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings
    from app.worker.service import CheckService, Limits

    settings = Settings(worker_enabled=False, log_level="warning")
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        service = CheckService(
            tmp_path / "jobs.sqlite3",
            Limits(
                max_replicas_per_check=settings.max_replicas_per_check,
                processes_per_host=1,
                queue_size=4,
                check_timeout_s=settings.check_timeout_s,
                concurrent_checks=1,
            ),
        )
        client.app.state.checks = service  # type: ignore[attr-defined]
        try:
            yield client
        finally:
            client.app.state.checks = None  # type: ignore[attr-defined]
            service.store.close()
