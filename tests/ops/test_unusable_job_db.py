"""A job database that cannot be opened: the planner still serves, and the worker says why."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

PLAN = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 8}


def test_an_unusable_job_database_disables_checks_with_the_reason(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the database's folder should be")
    db = blocker / "jobs.sqlite3"  # cannot be created, even by root
    with TestClient(create_app(Settings(jobs_db=db, processes_per_host=1))) as client:
        assert client.post("/v1/plans", json=PLAN).status_code == 200
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert str(db) in ready.json()["worker"]["error"]
        check = client.post("/v1/checks", json={"plan": PLAN})
        assert check.status_code == 503
        assert check.headers["content-type"] == "application/problem+json"
        assert str(db) in check.json()["detail"]
