"""Jobs in SQLite: they outlive the process, and a restart settles interrupted ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.jobs import IllegalTransition, Job, JobStatus
from app.worker.service.store import INTERRUPTED, JobStore


def test_jobs_survive_reopening_and_running_ones_fail_on_recovery(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    store = JobStore(path)
    store.create("done", {"body": {"x": 1}})
    assert store.start("done")
    store.finish("done", JobStatus.SUCCEEDED, result={"passed": True})
    store.create("running", {"body": {}})
    store.start("running")
    store.create("queued", {"body": {}})
    store.close()

    store = JobStore(path)
    assert store.recover() == ["queued"]
    done = store.get("done")
    assert done is not None and done.status == "succeeded" and done.result == {"passed": True}
    running = store.get("running")
    assert running is not None and running.status == "failed" and running.error == INTERRUPTED
    assert running.finished_at is not None
    assert [j.id for j in store.recent(10)] == ["queued", "running", "done"]
    assert [j.id for j in store.recent(10, JobStatus.FAILED)] == ["running"]
    store.close()


def test_a_cancelled_job_is_not_started_or_overwritten(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite3")
    store.create("a", {"body": {}})
    store.finish("a", JobStatus.CANCELLED, error="cancelled before it started")
    assert not store.start("a")
    store.finish("a", JobStatus.SUCCEEDED, result={"passed": True})
    job = store.get("a")
    assert job is not None and job.status == "cancelled" and job.result is None
    assert store.get("missing") is None
    store.close()


def test_a_job_refuses_a_move_its_status_does_not_allow(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite3")
    job = store.create("a", {"body": {}})
    assert job.status is JobStatus.QUEUED and job.submission == {"body": {}}
    job.check_transition(JobStatus.RUNNING)
    job.check_transition(JobStatus.CANCELLED)
    with pytest.raises(IllegalTransition, match="cannot become succeeded"):
        job.check_transition(JobStatus.SUCCEEDED)
    store.finish("a", JobStatus.CANCELLED)
    done = store.get("a")
    assert done is not None and done.status.finished
    with pytest.raises(IllegalTransition, match="check a already cancelled"):
        done.check_transition(JobStatus.CANCELLED)
    with pytest.raises(ValueError, match="not a finished status"):
        store.finish("a", JobStatus.RUNNING)
    # The JSON a job is served and stored as: the same keys and plain values as the row.
    assert Job.from_json(done.to_json()) == done
    assert done.to_json()["status"] == "cancelled" and type(done.to_json()["status"]) is str
    store.close()
