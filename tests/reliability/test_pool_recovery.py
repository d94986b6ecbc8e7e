"""The warm pool recovers from its processes' deaths at any moment, against a real uvicorn:
the fork server SIGKILLed while the ranks start (the reported fault: the pool started no
rank again, the fork server stayed a zombie, every queued check waited its whole timeout and
failed with a false reason, and /readyz said ready), a rank killed while it warms up, the
fork server killed mid-check. Each time the pool comes back warm, reaps what died, a queued
check runs, and /readyz never says ready while the worker is not."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.installed import installed
from support.polling import hold_ranks, wait_check, wait_for
from support.processes import children, fork_server, rss_and_fds, session_processes, zombies
from support.servers import Server, serve, worker_env

pytestmark = [pytest.mark.slow, installed("torch")]

EVEN_2 = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}
# Generous for two loaded cores: a fresh fork server imports torch again before any rank warms.
RECOVERY_S = 60


def truthful_readyz(server: Server) -> dict[str, Any]:
    """/readyz, held to the truth: `ready` (and 200) exactly when every rank is warm."""
    response = server.client.get("/readyz")
    body: dict[str, Any] = response.json()
    worker = body["worker"]
    warm = worker.get("ready") is True
    assert (body["status"] == "ready") == warm, body
    assert (response.status_code == 200) == warm, (response.status_code, body)
    return body


def test_fork_server_killed_while_the_ranks_start(tmp_path: Path) -> None:
    with serve(worker_env(tmp_path / "jobs.sqlite3", 2), tmp_path / "server.log") as server:
        pid = server.process.pid
        first = wait_for(lambda: fork_server(pid), "the fork server", 30, proc=server.process)
        os.kill(first, signal.SIGKILL)  # still importing torch: no rank has started yet
        started = time.monotonic()
        not_ready = truthful_readyz(server)
        assert not_ready["worker"]["ready"] is False
        queued = server.client.post("/v1/checks", json={"plan": EVEN_2, "timeout_s": RECOVERY_S})
        assert queued.status_code == 202, queued.text

        host = server.wait_warm(2, models=True, timeout=RECOVERY_S)  # the registered model described too
        recovered = time.monotonic() - started
        assert all(m["loaded"] for m in host["models"]), host["models"]
        second = fork_server(pid)
        assert second not in (None, first)
        assert zombies(pid) == [], "the dead fork server was never reaped"
        assert truthful_readyz(server)["worker"]["ready"] is True
        job = wait_check(server.client, queued.headers["location"], timeout=RECOVERY_S)
        assert job["status"] == "succeeded" and job["result"]["passed"], job
        print(f"warm again {recovered:.1f} s after the fork server was killed")
    assert session_processes(pid) == []


def test_sigterm_while_the_ranks_start_stops_at_once(tmp_path: Path) -> None:
    """A stop used to wait for the fork server's torch import to end each start (seconds;
    past `docker stop`'s 10 s grace on a loaded host): it ends the fork server instead."""
    with serve(worker_env(tmp_path / "jobs.sqlite3", 2), tmp_path / "server.log") as server:
        pid = server.process.pid
        wait_for(lambda: fork_server(pid), "the fork server", 30, interval=0.01, proc=server.process)
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=30)
        stopped = time.monotonic() - started
        assert stopped < 4, f"the stop took {stopped:.1f} s"
        assert "Task exception was never retrieved" not in (tmp_path / "server.log").read_text()
    assert session_processes(pid) == []


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the faults after start-up (each test leaves it warm); two checks may run
    at once, so that one can wait for the ranks another holds."""
    folder = tmp_path_factory.mktemp("warm")
    env = worker_env(folder / "jobs.sqlite3", 2, concurrent_checks="2")
    with serve(env, folder / "server.log") as server:
        server.wait_warm(2)
        yield server
    assert session_processes(server.process.pid) == []


def test_a_check_that_waits_for_busy_ranks_says_so(warm: Server) -> None:
    """A check that timed out, or was cancelled, while it waited for free ranks says that it
    never ran; it used to say its ranks had been killed and replaced."""
    server = warm
    server.wait_warm(2)
    holder = hold_ranks(server.client, EVEN_2, timeout=30)
    waiting = server.client.post("/v1/checks", json={"plan": EVEN_2, "timeout_s": 1})
    late = wait_check(server.client, waiting.headers["location"], ("failed",), timeout=30)
    assert "were not free within timeout_s=1 (2 of 2 warm, 0 free)" in late["error"], late["error"]
    assert "did not run" in late["error"] and "killed" not in late["error"]
    second = server.client.post("/v1/checks", json={"plan": EVEN_2})
    wait_check(server.client, second.headers["location"], ("running",), timeout=30)
    cancelled = server.client.delete(second.headers["location"]).json()
    assert cancelled["status"] == "cancelled", cancelled
    assert cancelled["error"] == "cancelled while it waited for free rank processes; nothing ran"
    server.client.delete(holder)
    assert server.check({"plan": EVEN_2})["result"]["passed"]


def test_fork_server_killed_mid_check_says_so_and_recovers(warm: Server) -> None:
    server, pid = warm, warm.process.pid
    server.wait_warm(2)
    location = hold_ranks(server.client, EVEN_2, timeout=30)
    server_pid = fork_server(pid)
    assert server_pid is not None
    os.kill(server_pid, signal.SIGKILL)
    job = wait_check(server.client, location, ("failed",), timeout=30)
    # The true reason: the ranks died with their fork server, which was killed.
    assert "fork server" in job["error"] and "signal 9" in job["error"], job["error"]
    assert "shutting down" not in job["error"]
    server.wait_warm(2, timeout=RECOVERY_S)
    assert zombies(pid) == []
    assert server.check({"plan": EVEN_2}, timeout=RECOVERY_S)["result"]["passed"]


def test_replaced_ranks_leave_no_open_files_behind(warm: Server) -> None:
    """Each replaced rank used to keep two pipe descriptors in the server (its process
    object's status pipe) until the garbage collector found it, 15 s or more later. Two
    replacements (there were five) leak four descriptors where that bug is back, past the one
    allowed for noise."""
    server, pid = warm, warm.process.pid
    server.wait_warm(2)
    assert server.check({"plan": EVEN_2})["result"]["passed"]
    _, before = rss_and_fds(pid)
    for _ in range(2):
        victim = children(fork_server(pid) or 0)[0]
        os.kill(victim, signal.SIGKILL)

        def replaced(victim: int = victim) -> bool:
            return victim not in {p["pid"] for p in server.wait_warm(2)["processes"]}

        wait_for(replaced, "a replacement", RECOVERY_S)
    assert server.check({"plan": EVEN_2})["result"]["passed"]
    wait_for(lambda: rss_and_fds(pid)[1] <= before + 1, f"no more than {before + 1} open files", 5)


def test_ranks_that_cannot_start_make_the_worker_unavailable_not_a_spin(tmp_path: Path) -> None:
    """A torch that fails to import in the ranks (the web process never imports it): every
    rank dies before it is warm. The pool used to start a new one at once, forever, while
    /readyz said ready and checks waited their whole timeout; now it backs off, /readyz says
    the worker is unavailable and why, and a check fails at once with that reason."""
    broken = tmp_path / "site" / "torch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("this torch is broken on purpose")\n')
    pythonpath = os.pathsep.join(filter(None, [str(broken.parent), os.environ.get("PYTHONPATH")]))
    env = worker_env(tmp_path / "jobs.sqlite3", 2) | {"PYTHONPATH": pythonpath}
    log = tmp_path / "server.log"
    with serve(env, log) as server:

        def unavailable() -> dict[str, Any] | None:
            ready = server.client.get("/readyz")
            body: dict[str, Any] = ready.json()
            return body if ready.status_code == 503 and body["status"] == "worker unavailable" else None

        ready = wait_for(
            unavailable, "the worker to say it is unavailable", RECOVERY_S, log, proc=server.process
        )
        assert (
            "keep failing to start" in ready["worker"]["error"]
            and "before it was warm" in ready["worker"]["error"]
        )
        started = time.monotonic()
        job = server.check({"plan": EVEN_2, "timeout_s": 60}, timeout=30)
        assert job["status"] == "failed" and "no rank process could start" in job["error"], job
        assert time.monotonic() - started < 20, "the check waited for ranks that cannot start"
        # Backing off: a handful of tries, not a new rank every few milliseconds.
        tries = log.read_text().count("trying again in")
        time.sleep(5)
        assert log.read_text().count("trying again in") - tries <= 4
    assert session_processes(server.process.pid) == []
