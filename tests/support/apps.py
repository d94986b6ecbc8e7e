"""The app in-process (a TestClient) with the worker's rank processes warm, for the tests that
run real checks without a server subprocess."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

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
