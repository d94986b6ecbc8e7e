"""Who can reach a worker: one without an API key that listens beyond loopback warns at
start-up and says so in /v1/host (one with a key, or on loopback, does not); a rendezvous
keeps to the allow-list, and one that names another port on loopback (here: the server's own
HTTP port) fails with a reason and harms nothing."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.installed import installed
from support.polling import wait_check, wait_for
from support.processes import session_processes
from support.servers import (
    HOST,
    QUIET,
    ROOT,
    Server,
    free_port,
    running,
    serve,
    server_argv,
    wait_until_live,
    worker_env,
)

pytestmark = [pytest.mark.slow, installed("torch")]

EVEN_2 = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}
WARNING = "the worker runs checks for anyone who can reach"


def everywhere(tmp_path: Path, **settings: str) -> tuple[dict[str, Any], str]:
    """A worker bound to 0.0.0.0 (every interface): /v1/host's exposure and its log."""
    port = free_port()
    log = tmp_path / "server.log"
    env = {**os.environ, **QUIET, **worker_env(tmp_path / "jobs.sqlite3", 1, **settings)}
    with running(server_argv(port, "--host", "0.0.0.0"), env, ROOT, log) as proc:
        wait_until_live(proc, port, log)
        key = settings.get("api_key")
        headers = {"X-API-Key": key} if key else {}
        host = httpx.get(f"http://{HOST}:{port}/v1/host", headers=headers, timeout=10).json()
        if not key:
            wait_for(lambda: WARNING in log.read_text(), "the warning in the log", 10, log)
        time.sleep(0.3)  # past the start-up check either way
    exposure: dict[str, Any] = host["exposure"]
    assert exposure["listening"] == [f"0.0.0.0:{port}"], exposure
    return exposure, log.read_text()


def test_a_keyless_worker_on_every_interface_warns_and_says_so(tmp_path: Path) -> None:
    exposure, log = everywhere(tmp_path)
    assert exposure["api_key"] is False
    assert WARNING in exposure["warning"] and "0.0.0.0" in exposure["warning"]
    assert "BATCHPLAN_API_KEY" in exposure["warning"]
    assert log.count(WARNING) == 1


def test_a_worker_with_a_key_does_not_warn(tmp_path: Path) -> None:
    exposure, log = everywhere(tmp_path, api_key="s3cret")
    assert exposure == {**exposure, "api_key": True, "warning": None}
    assert WARNING not in log


def test_on_loopback_no_warning_and_rendezvous_keep_to_the_allow_list(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with serve(worker_env(tmp_path / "jobs.sqlite3", 2), log) as server:
        server.wait_warm(2)
        exposure = server.client.get("/v1/host").json()["exposure"]
        assert exposure == {"listening": [f"{HOST}:{server.port}"], "api_key": False, "warning": None}

        # A host outside the allow-list (TEST-NET-1, reserved for documentation): refused
        # before anything is queued, let alone connected to.
        outside = {"endpoint": "192.0.2.1:29400", "nnodes": 2, "run_id": "outside"}
        refused = server.client.post("/v1/checks", json={"plan": EVEN_2, "rendezvous": outside})
        assert refused.status_code == 422, refused.text
        assert refused.json()["errors"][0]["pointer"] == "/rendezvous/endpoint"
        assert server.client.get("/v1/checks").json()["checks"] == []

        # Loopback is allowed, whatever the port: the server's own, where no store answers.
        taken = f"{HOST}:{server.port}"
        alone = rendezvous_check(server, {"endpoint": taken, "nnodes": 1, "run_id": "alone"})
        assert f"the rendezvous endpoint {taken} is in use" in alone["error"], alone["error"]
        # That check's ranks were replaced; the next one must find them warm to wait at its
        # rendezvous (on a loaded machine a replacement can take longer than its timeout).
        server.wait_warm(2)
        started = time.monotonic()
        two = rendezvous_check(server, {"endpoint": taken, "nnodes": 2, "run_id": "two"})
        assert "did not finish within timeout_s=4" in two["error"], two["error"]
        assert time.monotonic() - started < 30
        server.wait_warm(2)
        assert server.check({"plan": EVEN_2})["result"]["passed"]
    assert WARNING not in log.read_text()
    assert session_processes(server.process.pid) == []


def rendezvous_check(server: Server, rendezvous: dict[str, Any]) -> dict[str, Any]:
    """Submit a check at `rendezvous`; while it runs, the server's HTTP answers. The job, failed."""
    body = {"plan": EVEN_2, "rendezvous": rendezvous, "timeout_s": 4}
    response = server.client.post("/v1/checks", json=body)
    assert response.status_code == 202, response.text
    assert server.client.get("/livez").status_code == 200
    assert server.client.post("/v1/plans", json=EVEN_2).status_code == 200
    return wait_check(server.client, response.headers["location"], ("failed",), timeout=30)
