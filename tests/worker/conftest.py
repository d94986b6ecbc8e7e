"""The worker tests' shared warm app with operator models registered (support/registered_models.py):
4 warm ranks, every model built, for tests/worker/service/test_check_models.py,
tests/worker/checks/test_token_check.py, tests/worker/checks/mesh/test_mesh_checks.py and
tests/worker/checks/run/test_run_checks.py. One app for them all: each module's own cost four
cold ranks and their model builds. Its checks may take 240 s (a run of several steps on a busy
host)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from fastapi.testclient import TestClient


@pytest.fixture(scope="session")
def models_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """Jobs in a fresh database; the modules that use it share it, so a test must not depend
    on which jobs it holds."""
    pytest.importorskip("torch")
    from support.apps import warm_client
    from support.registered_models import registry

    yield from warm_client(
        tmp_path_factory, 4, models=True, log_level="warning", check_models=registry(), check_timeout_s=240
    )
