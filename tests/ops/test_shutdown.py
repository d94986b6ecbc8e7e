"""SIGTERM to a real uvicorn server with warm ranks and a running check: the server exits
promptly, leaves no process of its session behind, and the check is recorded as stopped by
the shutdown. Once to uvicorn alone (`kill PID`), once to the whole process group (what
Ctrl-C, `docker stop` and systemd do: the ranks and the fork server get it at the same time).
And after a finished check: the server reaps every process it started before it exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from support.bodies import lonely_rendezvous
from support.image_targets import process_env, target_argv
from support.installed import installed
from support.polling import wait_for as _wait
from support.processes import alive as _alive
from support.processes import descendants, session_processes, still_there
from support.servers import HOST, ROOT, free_port, running, wait_until_live, worker_env
from support.servers import request as _request

pytestmark = [pytest.mark.slow, installed("torch")]

EVEN_2 = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}
EXIT_LIMIT_S = 15.0
ORPHAN_GRACE_S = 3.0


def _exit_code(server: subprocess.Popen[bytes], log: Path) -> int:
    try:
        return server.wait(timeout=EXIT_LIMIT_S)
    except subprocess.TimeoutExpired as err:
        raise AssertionError(
            f"uvicorn still running {EXIT_LIMIT_S} s after SIGTERM:\n{log.read_text()[-3000:]}"
        ) from err


def _env(db: Path, processes: int) -> dict[str, str]:
    """The worker image's environment (its API key left out), logging JSON lines to read."""
    image = {k: v for k, v in process_env("worker", db.parent).items() if k != "BATCHPLAN_API_KEY"}
    return image | worker_env(db, processes, log_format="json", log_level="info", check_timeout_s="120")


def _blocker(port: int) -> dict[str, Any]:
    """A 2-node check whose second node never joins: it stays running."""
    body = {"plan": EVEN_2, "rendezvous": lonely_rendezvous(HOST)}
    status, _, job = _request(port, "POST", "/v1/checks", body)
    assert status == 202, job
    return job  # type: ignore[no-any-return]


@pytest.mark.parametrize("target", ["uvicorn", "group"])
def test_sigterm_cancels_the_running_check_and_leaves_no_process(target: str, tmp_path: Path) -> None:
    db = tmp_path / "jobs.sqlite3"
    port = free_port()
    log = tmp_path / "server.log"
    with running(target_argv("worker", port), _env(db, 2), ROOT, log) as server:
        wait_until_live(server, port, log)

        def warm() -> bool:
            ready = _request(port, "GET", "/readyz")[2]["worker"]
            return bool(ready.get("ready")) and ready["warm_processes"] == 2

        _wait(warm, "two warm ranks", 60, log)
        ranks = {p["pid"] for p in _request(port, "GET", "/v1/host")[2]["processes"]}
        job = _blocker(port)
        _wait(
            lambda: _request(port, "GET", f"/v1/checks/{job['id']}")[2]["status"] == "running",
            "running",
            30,
            log,
        )
        assert len(session_processes(server.pid)) >= 4, "uvicorn, the fork server and two ranks"
        # A client waiting (?wait=60) for a check queued behind it, which the shutdown leaves
        # queued for the next start: the shutdown answers it rather than let it wait out its
        # minute, which would hold uvicorn past EXIT_LIMIT_S.
        status, _, queued = _request(port, "POST", "/v1/checks", {"plan": EVEN_2})
        assert status == 202 and queued["status"] == "queued", queued
        waiting = ThreadPoolExecutor(1)
        waited = waiting.submit(_request, port, "GET", f"/v1/checks/{queued['id']}?wait=60", timeout=90)
        time.sleep(0.5)
        assert not waited.done()

        sent = time.monotonic()
        if target == "group":
            os.killpg(server.pid, signal.SIGTERM)
        else:
            os.kill(server.pid, signal.SIGTERM)
        code = _exit_code(server, log)
        took = time.monotonic() - sent
        status, _, answered = waited.result(timeout=5)
        waiting.shutdown()
        assert status == 200 and answered["status"] == "queued", answered
        assert code in (0, -signal.SIGTERM), code  # uvicorn re-raises the signal it shut down for

        deadline = time.monotonic() + ORPHAN_GRACE_S
        while (left := session_processes(server.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"processes outlived the server: {left}\n{log.read_text()[-3000:]}"
        assert not [pid for pid in ranks if _alive(pid)], "the warm ranks are gone"

    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    messages = [r["message"] for r in lines]
    assert any(m.startswith("shutting down:") for m in messages), messages[-20:]
    finished = next(r for r in lines if r["message"].startswith(f"check {job['id']} failed"))
    assert finished["job_id"] == job["id"]
    began = next(i for i, m in enumerate(messages) if m.startswith("shutting down:"))
    replaced = [m for m in messages[began:] if "replacing it" in m]
    assert not replaced, f"no rank is started once the shutdown began: {replaced}"

    # A restarted server on the same database reports the check stopped by the shutdown.
    port = free_port()
    log = tmp_path / "restarted.log"
    with running(target_argv("worker", port), _env(db, 1), ROOT, log) as restarted:
        wait_until_live(restarted, port, log)
        status, _, stored = _request(port, "GET", f"/v1/checks/{job['id']}")
        assert status == 200 and stored["status"] == "failed", stored
        assert stored["error"].startswith("server shutting down"), stored["error"]
        assert stored["finished_at"] is not None
    assert took < EXIT_LIMIT_S


def test_the_server_reaps_its_fork_server_and_ranks_before_it_exits(tmp_path: Path) -> None:
    """SIGTERM to uvicorn after a check ran on warm ranks: by the time the server has exited,
    every process it started (the fork server, its resource tracker, the ranks) has exited
    and been reaped, with no grace period: nothing is left to whoever adopts orphans."""
    db = tmp_path / "jobs.sqlite3"
    port = free_port()
    log = tmp_path / "server.log"
    with running(target_argv("worker", port), _env(db, 2), ROOT, log) as server:
        wait_until_live(server, port, log)
        status, _, job = _request(port, "POST", "/v1/checks", {"plan": EVEN_2})
        assert status == 202, job
        done = _wait(
            lambda: (
                (j := _request(port, "GET", f"/v1/checks/{job['id']}")[2])["status"] != "queued"
                and j["status"] != "running"
                and j
            ),
            "the check to finish",
            90,
            log,
        )
        assert done["status"] == "succeeded" and done["result"]["passed"], done
        ranks = {p["pid"] for p in _request(port, "GET", "/v1/host")[2]["processes"]}
        children = descendants(server.pid)
        assert ranks <= set(children), (ranks, children)
        assert len(children) >= 3, f"the fork server and two ranks at least: {children}"

        os.kill(server.pid, signal.SIGTERM)
        code = _exit_code(server, log)
        assert code in (0, -signal.SIGTERM), code
        left = {pid: state for pid, started in children.items() if (state := still_there(pid, started))}
        assert not left, f"outlived the server (state by pid; Z: unreaped): {left}\n{log.read_text()[-3000:]}"


def test_no_new_checks_once_the_shutdown_began(tmp_path: Path) -> None:
    """In-process: after begin_shutdown (what SIGTERM triggers), POST /v1/checks is a 503
    problem with Retry-After, /readyz is 503, and reads still work."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    settings = Settings(jobs_db=tmp_path / "jobs.sqlite3", processes_per_host=1, log_level="warning")
    with TestClient(create_app(settings)) as client:
        service = client.app.state.checks  # type: ignore[attr-defined]
        service.begin_shutdown()
        response = client.post("/v1/checks", json={"plan": EVEN_2})
        assert response.status_code == 503 and response.headers["content-type"] == "application/problem+json"
        assert int(response.headers["retry-after"]) >= 1 and "shutting down" in response.json()["detail"]
        assert client.get("/readyz").status_code == 503
        assert client.get("/v1/checks").status_code == 200
        assert client.post("/v1/plans", json=EVEN_2).status_code == 200
