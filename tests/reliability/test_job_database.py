"""The job database under stress: two servers on one file (the second refuses; nothing is
corrupted), a file that is not batchplan's or is from a newer schema (a clear start-up error,
the file untouched), a database locked past SQLite's busy timeout and a full disk (a clear
error, the planner serves on, the jobs run once the database works again); and the results a
restart keeps, with the jobs it interrupted failed. The cases that need a real server share
two server lifetimes on one database rather than start five (three servers, two in-process)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import resource
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.fake_runner import FakeRunner
from support.polling import hold_ranks, wait_check
from support.processes import session_processes
from support.servers import Server, request, serve, worker_env

from app.contract.codec import encode
from app.contract.jobs import JobStatus
from app.contract.request import check_request
from app.main import create_app
from app.settings import Settings
from app.worker.service.admission import Admission
from app.worker.service.execution import Execution
from app.worker.service.limits import Limits
from app.worker.service.store import JobStore

EVEN_2 = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}
PLAN = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 8}
LIMITS = Limits(
    max_replicas_per_check=8, processes_per_host=1, queue_size=4, check_timeout_s=30, concurrent_checks=1
)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def integrity(path: Path) -> str:
    with sqlite3.connect(path) as db:
        return str(db.execute("PRAGMA integrity_check").fetchone()[0])


def _newer_schema(path: Path) -> None:
    JobStore(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 2")
    db.execute("PRAGMA journal_mode = DELETE")  # the whole database in its one file
    db.close()


def _foreign(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        db.execute("INSERT INTO invoices (total) VALUES (12.5)")


def _other_jobs(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, owner TEXT)")


def _not_sqlite(path: Path) -> None:
    path.write_bytes(b"PK\x03\x04 a zip archive, not a job database" * 50)


UNUSABLE = {
    "not SQLite": (_not_sqlite, "not an SQLite database (file is not a database)"),
    "a newer schema": (_newer_schema, "schema 2, written by a newer batchplan; this one reads schema 1"),
    "another program's database": (_foreign, "without batchplan's jobs (its tables: invoices)"),
    "another program's jobs table": (_other_jobs, "a jobs table without the columns"),
}


@pytest.mark.parametrize("case", list(UNUSABLE))
def test_an_unusable_file_is_a_clear_start_up_error_and_stays_untouched(tmp_path: Path, case: str) -> None:
    db = tmp_path / "jobs.sqlite3"
    make, reason = UNUSABLE[case]
    make(db)
    before = digest(db)
    settings = Settings(jobs_db=db, processes_per_host=1, log_level="warning")
    with TestClient(create_app(settings, runner=FakeRunner(size=1))) as client:
        assert client.post("/v1/plans", json=PLAN).status_code == 200
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "worker unavailable"
        error = ready.json()["worker"]["error"]
        assert str(db) in error and reason in error, error
        check = client.post("/v1/checks", json={"plan": PLAN})
        assert check.status_code == 503 and reason in check.json()["detail"]
    assert digest(db) == before, "the file was changed"
    assert not (tmp_path / "jobs.sqlite3-wal").exists()


@pytest.mark.slow
def test_a_queued_job_outlasts_a_database_locked_past_the_busy_timeout(tmp_path: Path) -> None:
    """The worker that took a queued job while another program held the database past SQLite's
    10 s busy timeout used to die, and with it every later job (queued until a restart)."""
    path = tmp_path / "jobs.sqlite3"
    store = JobStore(path)
    body = {"plan": PLAN}
    store.create("a", encode(Admission(LIMITS, {}, FakeRunner(size=1)).prepare(check_request(body), body)))
    locker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    locker.execute("BEGIN EXCLUSIVE")
    released = threading.Timer(11.0, lambda: locker.execute("ROLLBACK"))

    async def scenario() -> Any:
        runner = FakeRunner(size=1)
        runner.start()
        execution = Execution(store, runner, LIMITS, {})
        execution.enqueue("a")
        execution.start()
        released.start()
        async with asyncio.timeout(60):
            while (job := store.get("a")) is None or not job.status.finished:
                await asyncio.sleep(0.1)
        execution.begin_shutdown()
        await execution.wait()
        return job

    try:
        job = asyncio.run(scenario())
    finally:
        released.cancel()
        locker.close()
        store.close()
    assert job.status is JobStatus.SUCCEEDED, job


@pytest.mark.slow
def test_one_database_across_servers_a_second_refuses_a_restart_keeps_and_a_full_disk(tmp_path: Path) -> None:
    """One database's life across two server lifetimes (each start is torch's import and two
    ranks: the cases share them). A second server on the file refuses and breaks nothing; a
    restart keeps the finished results and fails the jobs the stop interrupted; then a full
    disk on the restarted server (_a_full_disk_is_a_clear_error_and_the_planner_serves_on)."""
    pytest.importorskip("torch")
    db = tmp_path / "jobs.sqlite3"
    with serve(worker_env(db, 2), tmp_path / "first.log") as first:
        first.wait_warm(2)
        done = first.check({"plan": EVEN_2})
        running = hold_ranks(first.client, EVEN_2, timeout=30)
        with serve(worker_env(db, 2), tmp_path / "second.log") as second:
            status, _, ready = request(second.port, "GET", "/readyz")
            assert status == 503, ready
            error = ready["worker"]["error"]
            assert f"in use by another server (pid {first.process.pid})" in error, error
            status, _, problem = request(second.port, "POST", "/v1/checks", {"plan": EVEN_2})
            assert status == 503 and "in use by another server" in problem["detail"]
            assert request(second.port, "POST", "/v1/plans", PLAN)[0] == 200
        # The first server's jobs are as it left them: the second neither failed its running
        # check (as a restart would) nor ran its queue.
        assert first.client.get(running).json()["status"] == "running"
        first.client.delete(running)
        assert first.check({"plan": EVEN_2})["result"]["passed"]
    assert integrity(db) == "ok"
    _as_a_killed_server_leaves_it(db, done["id"])
    # Free once the first stopped. Its log goes nowhere: under the full disk below a log file
    # could not be written either.
    with serve(worker_env(db, 2), None) as third:
        again = third.job(done["id"])
        assert again["status"] == "succeeded" and again["result"] == done["result"]
        interrupted = third.job("was-running")
        assert interrupted["status"] == "failed" and "server stopped" in interrupted["error"]
        third.wait_warm(2)
        assert wait_check(third.client, "/v1/checks/was-queued", ("succeeded",))["result"]["passed"]
        older = wait_check(third.client, "/v1/checks/queued-by-an-older-version", ("succeeded",))
        assert older["result"]["passed"]
        _a_full_disk_is_a_clear_error_and_the_planner_serves_on(third, done)
    assert integrity(db) == "ok"
    assert session_processes(third.process.pid) == []


def _as_a_killed_server_leaves_it(db: Path, done: str) -> None:
    """What a server killed mid-check leaves behind: one job running, one queued."""
    store = JobStore(db)
    payload = store.get(done).submission  # type: ignore[union-attr]
    store.create("was-running", payload)
    store.start("was-running")
    store.create("was-queued", payload)
    # A version before the spec was stored as an object kept it as a JSON string.
    store.create("queued-by-an-older-version", {**payload, "spec": json.dumps(payload["spec"])})
    store.close()


def _a_full_disk_is_a_clear_error_and_the_planner_serves_on(server: Server, done: dict[str, Any]) -> None:
    """Writes that fail (the server's file size limit at 0, as a full disk fails them): a
    submission is a 503 naming the job database, reads and plans answer, a check that ends
    meanwhile is recorded once writes work again, and the queue then runs."""
    pid = server.process.pid
    holder = hold_ranks(server.client, EVEN_2, timeout=30, timeout_s=4)
    queued = server.client.post("/v1/checks", json={"plan": EVEN_2}).headers["location"]
    limits = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (0, limits[1]))
    try:
        refused = server.client.post("/v1/checks", json={"plan": EVEN_2})
        assert refused.status_code == 503, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        assert "job database" in refused.json()["detail"] and refused.headers["retry-after"]
        assert server.client.post("/v1/plans", json=PLAN).status_code == 200
        assert server.job(done["id"])["result"] == done["result"]
        time.sleep(6)  # the holder times out now; its end cannot be written
        assert server.client.get(holder).json()["status"] == "running"
    finally:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, limits)
    late = wait_check(server.client, holder, ("failed",), timeout=30)
    assert "did not finish within timeout_s=4" in late["error"]
    assert wait_check(server.client, queued, timeout=60)["result"]["passed"]
    assert server.check({"plan": EVEN_2})["result"]["passed"]
