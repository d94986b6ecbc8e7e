"""Jobs in SQLite: they outlive the process, and a restart settles interrupted ones."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from app.contract.codec import decode, encode
from app.contract.jobs import IllegalTransition, Job, JobStatus
from app.worker.service.store import INTERRUPTED, RECENT_JOBS, JobStore

PASSED = '{"passed":true}'  # a result as the service stores it: the codec's JSON text


def test_jobs_survive_reopening_and_running_ones_fail_on_recovery(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    store = JobStore(path)
    store.create("done", {"body": {"x": 1}})
    assert store.start("done")
    store.finish("done", JobStatus.SUCCEEDED, result=PASSED)
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
    store.finish("a", JobStatus.SUCCEEDED, result=PASSED)
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
    assert decode(Job, json.loads(json.dumps(encode(done)))) == done
    assert encode(done)["status"] == "cancelled" and type(encode(done)["status"]) is str
    store.close()


def _from_disk(path: Path, job_id: str) -> Job | None:
    """The job as the database file holds it, through a connection of its own."""
    with sqlite3.connect(path) as db:
        db.row_factory = sqlite3.Row
        return JobStore._job(db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone())


def test_the_jobs_kept_in_memory_are_what_the_file_holds_after_every_write(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    store = JobStore(path)
    writes = [
        lambda: store.create("a", {"body": {"x": 1}}),
        lambda: store.start("a"),
        lambda: store.start("a"),  # refused: no longer queued
        lambda: store.finish("a", JobStatus.SUCCEEDED, result=PASSED),
        lambda: store.finish("a", JobStatus.CANCELLED, error="too late"),  # refused: finished
    ]
    for write in writes:
        write()
        assert store.cached("a") == _from_disk(path, "a")
    cached = store.cached("a")
    assert cached is not None and cached.status == "succeeded" and cached.result == {"passed": True}
    store.close()

    # A job this store has not written nor read is not in memory until read from the file.
    store = JobStore(path)
    assert store.cached("a") is None
    assert store.get("a") == store.cached("a") == _from_disk(path, "a")
    assert store.cached("missing") is None and store.get("missing") is None
    store.close()


def test_only_the_latest_jobs_stay_in_memory_and_the_rest_are_read_from_the_file(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite3")
    ids = [f"job{k}" for k in range(RECENT_JOBS + 1)]
    for job_id in ids:
        store.create(job_id, {"body": {}})
    assert store.cached(ids[0]) is None and store.cached(ids[-1]) is not None
    first = store.get(ids[0])
    assert first is not None and store.cached(ids[0]) == first
    assert store.cached(ids[1]) is None  # the least recent one made room
    store.close()


def test_a_restart_recovery_leaves_no_stale_job_in_memory(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    store = JobStore(path)
    store.create("running", {"body": {}})
    store.start("running")
    store.recover()  # what a restart does: running jobs failed
    assert store.cached("running") is None
    recovered = store.get("running")
    assert recovered is not None and recovered.status == "failed"
    store.close()


def test_a_write_reads_nothing_back_and_memory_holds_what_was_written(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite3")
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    submission = {"body": {"x": 1}}
    created = store.create("a", submission)
    assert store.start("a")
    result = json.dumps({"model": "mlp", "passed": True}, separators=(",", ":"))
    store.finish("a", JobStatus.SUCCEEDED, result=result)
    assert statements and not [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    cached = store.cached("a")
    assert cached is not None and cached.submission is submission and created.submission is submission
    assert cached.result_json is result  # the text written, kept as it is: served as it is
    assert cached == _from_disk(tmp_path / "jobs.sqlite3", "a")
    store.close()


def test_a_result_an_older_server_stored_is_served_in_this_servers_form(tmp_path: Path) -> None:
    """Older servers stored json.dumps's default form; the same bytes are served for every job."""
    path = tmp_path / "jobs.sqlite3"
    store = JobStore(path)
    store.create("old", {"body": {}})
    store.close()
    old = {"model": "mlp", "passed": True, "warnings": ["sequences of 16 × 2 tokens"], "rel_l2": 1e-17}
    with sqlite3.connect(path) as db:
        db.execute("UPDATE jobs SET status = 'succeeded', result = ? WHERE id = 'old'", (json.dumps(old),))
    db.close()
    store = JobStore(path)
    job = store.get("old")
    assert job is not None and job.result == old
    served = json.dumps(old, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    assert job.result_json == served and "×" in served
    store.close()
