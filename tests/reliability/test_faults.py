"""Faults with real processes: the server SIGKILLed mid-check and restarted on the same
database, and a job database that is locked or read-only (on the restarted server: one start
fewer). In each the job ends with a
clear reason, no process is left behind (scanned in /proc by session id), finished results
are intact and the next check passes.

Already covered in tests/api/test_checks_api.py, not repeated here: a rank killed mid-check,
a rank that hangs past timeout_s, a full queue (429 + Retry-After), restart recovery from a
hand-written database.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from support.installed import installed
from support.polling import hold_ranks, wait_for
from support.processes import session_processes
from support.servers import Server, request, serve, worker_env

pytestmark = [pytest.mark.slow, installed("torch")]

EVEN_2 = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}


def test_server_sigkilled_mid_check_then_restarted_on_the_same_db_then_locked(tmp_path: Path) -> None:
    """The restarted server then meets a locked database
    (_locked_database_delays_then_recovers_and_jobs_end_clearly): one server start fewer."""
    db = tmp_path / "jobs.sqlite3"
    with serve(worker_env(db), tmp_path / "first.log") as first:
        first.wait_warm(2)
        done = first.check({"plan": EVEN_2})
        assert done["status"] == "succeeded" and done["result"]["passed"]
        hung = hold_ranks(first.client, EVEN_2, timeout=30)
        os.kill(first.process.pid, signal.SIGKILL)  # the server only: its ranks must follow
        first.process.wait(timeout=10)
        # Nothing of the dead server may linger: the fork server and ranks see their pipes close.
        leftovers = wait_for(lambda: not session_processes(first.process.pid) or None, "orphans to exit", 20)
        assert leftovers
        orphans = session_processes(first.process.pid)
    assert orphans == [], f"processes left behind by a SIGKILLed server: {orphans}"

    with serve(worker_env(db), tmp_path / "second.log") as second:
        second.wait_warm(2)
        interrupted = second.client.get(hung).json()
        assert interrupted["status"] == "failed" and "server stopped" in interrupted["error"]
        assert second.job(done["id"])["result"] == done["result"]  # finished results intact
        assert second.check({"plan": EVEN_2})["result"]["passed"]
        _locked_database_delays_then_recovers_and_jobs_end_clearly(second, db)
    assert session_processes(second.process.pid) == []


def _locked_database_delays_then_recovers_and_jobs_end_clearly(server: Server, db: Path) -> None:
    """Another connection locks the server's database: briefly, a check waits then runs; past
    SQLite's busy timeout, a clear problem (never a hang) and the server serves on."""
    before = server.check({"plan": EVEN_2})
    # Another connection holds an exclusive lock briefly: the request waits, then succeeds.
    locker = sqlite3.connect(db, isolation_level=None, timeout=1)
    locker.execute("BEGIN EXCLUSIVE")
    time.sleep(1.0)  # the lock must be held while the request arrives
    locker.execute("ROLLBACK")
    after = server.check({"plan": EVEN_2})
    assert after["result"]["passed"]
    # Held past SQLite's busy timeout while a check is submitted: a clear 5xx/4xx problem,
    # never a hang, and the server keeps serving.
    locker.execute("BEGIN EXCLUSIVE")
    started = time.monotonic()
    # Each on a connection of its own, as the server may close one it failed a request on.
    status, _, problem = request(server.port, "POST", "/v1/checks", {"plan": EVEN_2}, timeout=30)
    waited = time.monotonic() - started
    locker.execute("ROLLBACK")
    locker.close()
    assert status != 202 or waited < 11, (status, problem)
    if status != 202:
        assert status in (500, 503) and problem["detail"], problem
    assert request(server.port, "GET", "/livez")[0] == 200
    assert server.job(before["id"])["result"] == before["result"]
    assert server.check({"plan": EVEN_2})["result"]["passed"]
