"""Checks that span processes started elsewhere: two servers on this machine joining one
2-node check over HTTP, a server killed mid-check, and the rank program under torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.ports import free_port
from app.worker.gradcheck import torchrun_argv

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PLAN = {"topology": {"num_nodes": 2, "gpus_per_node": 2}, "global_batch_size": 32, "micro_batch_size": 4}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie has exited; only its parent's wait is missing
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


class Server:
    def __init__(self, db: Path, processes: int = 2) -> None:
        self.db, self.processes = db, processes
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "BATCHPLAN_JOBS_DB": str(db),
            "BATCHPLAN_PROCESSES_PER_HOST": str(processes),
            "BATCHPLAN_LOG_LEVEL": "warning",
        }
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "app.main:app",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.client = httpx.Client(base_url=self.url, timeout=10)

    def wait_warm(self, timeout: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "server exited"
            try:
                host: dict[str, Any] = self.client.get("/v1/host").json()
                if host["warm_processes"] >= self.processes:
                    return host
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError("server ranks never warmed up")

    def wait(self, location: str, statuses: tuple[str, ...], timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job: dict[str, Any] = self.client.get(location).json()
            if job["status"] in statuses:
                return job
            time.sleep(0.02)
        raise AssertionError(f"job stuck: {job}")

    def rank_pids(self) -> list[int]:
        return [p["pid"] for p in self.client.get("/v1/host").json()["processes"]]

    def stop(self) -> None:
        self.client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Server]]:
    started = [Server(tmp_path / "a.sqlite3"), Server(tmp_path / "b.sqlite3")]
    try:
        yield started
    finally:
        for server in started:
            server.stop()


def test_two_servers_join_one_two_node_check_and_a_killed_server_leaves_nothing(
    servers: list[Server], tmp_path: Path
) -> None:
    a, b = servers
    a.wait_warm()
    b.wait_warm()
    rendezvous = {"endpoint": f"127.0.0.1:{free_port()}", "nnodes": 2, "run_id": "two-node-check"}
    locations = []
    for server in (a, b):
        response = server.client.post("/v1/checks", json={"plan": PLAN, "rendezvous": rendezvous})
        assert response.status_code == 202, response.text
        locations.append(response.headers["location"])
    jobs = [server.wait(loc, ("succeeded", "failed")) for server, loc in zip(servers, locations, strict=True)]
    assert [j["status"] for j in jobs] == ["succeeded", "succeeded"], jobs
    results = [j["result"] for j in jobs]
    assert all(r["passed"] and r["nnodes"] == 2 and r["processes"] == 4 for r in results)
    assert results[0]["rel_l2"] == results[1]["rel_l2"] < 1e-13
    assert sorted(r["node_rank"] for r in results) == [0, 1]
    assert {c["name"] for c in results[0]["controls"]} >= {
        "accumulation_not_divided",
        "no_distributed_sampler",
    }

    # A server killed mid-check: its ranks go with it, and the restarted server reports the job failed.
    lonely = {"endpoint": f"127.0.0.1:{free_port()}", "nnodes": 2, "run_id": "never-completes"}
    location = a.client.post("/v1/checks", json={"plan": PLAN, "rendezvous": lonely}).headers["location"]
    a.wait(location, ("running",))
    ranks = a.rank_pids()
    a.process.kill()
    a.process.wait()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in ranks if alive(pid)], "rank processes outlived their server"
    restarted = Server(a.db)
    servers[0] = restarted
    deadline = time.monotonic() + 60
    while True:
        try:
            job = restarted.client.get(location).json()
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline and restarted.process.poll() is None
            time.sleep(0.1)
    assert job["status"] == "failed" and "server stopped while this check was running" in job["error"]
    assert restarted.client.get(locations[0]).json()["result"] == results[0]

    # A graceful stop ends every rank process too.
    ranks = restarted.wait_warm()["processes"]
    restarted.stop()
    assert not [p["pid"] for p in ranks if alive(p["pid"])]


def _torchrun(
    request: str, processes: int, *, extra: tuple[str, ...] | list[str] = (), timeout: int = 300
) -> Any:
    """The rank program under a real torchrun on this host; the one result rank 0 prints."""
    completed = subprocess.run(
        torchrun_argv(
            request, nproc_per_node=processes, rdzv_endpoint=f"127.0.0.1:{free_port()}", extra=extra
        ),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1  # rank 0 alone prints
    return json.loads(lines[0])


def test_the_rank_program_under_torchrun_prints_the_result() -> None:
    request = json.dumps(
        {
            "plan": {
                "topology": {
                    "node_groups": [
                        {"name": "fast", "num_nodes": 1, "gpus_per_node": 1, "relative_throughput": 3.0},
                        {"name": "slow", "num_nodes": 1, "gpus_per_node": 1},
                    ]
                },
                "global_batch_size": 24,
            }
        }
    )
    result = _torchrun(request, 2, timeout=120)
    assert result["passed"] and result["split"] == "proportional" and result["processes"] == 2
    assert any(c["name"] == "unweighted_mean" and c["detected"] for c in result["controls"])


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA GPUs")
def test_nccl_on_every_gpu() -> None:
    import torch

    gpus = torch.cuda.device_count()
    request = json.dumps(
        {
            "plan": {"topology": {"num_nodes": 1, "gpus_per_node": gpus}, "global_batch_size": 8 * gpus},
            "backend": "nccl",
        }
    )
    result = _torchrun(request, gpus)
    assert result["passed"] and result["backend"] == "nccl" and result["device"] == "cuda"


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA GPUs")
def test_a_factory_on_gpus_finds_equivalence_noise_and_its_micro_batch() -> None:
    """A registered-style factory under torchrun with NCCL: the equivalence findings, the
    noise scale and the micro-batch search against the GPU's own memory (no memory_bytes)."""
    import torch

    gpus = torch.cuda.device_count()
    request = json.dumps(
        {
            "plan": {"topology": {"num_nodes": 1, "gpus_per_node": gpus}, "global_batch_size": 64 * gpus},
            "backend": "nccl",
            "fit_micro_batch": {"max_micro_batch_size": 4096},
        }
    )
    result = _torchrun(request, gpus, extra=["--model-factory", "app.worker.example_models:wide_mlp"])
    assert result["backend"] == "nccl" and result["ddp_equivalence"]["equivalent"] is True
    search = result["micro_batch_search"]
    assert search["device"].startswith("cuda") and search["capacity_bytes"] > 1 << 30
    assert search["max_micro_batch_size"] == 64  # a replica's whole share fits an H100-class GPU
    noise = result["noise_scale"]  # one GPU: one replica, one micro-batch, nothing to compare
    assert noise is None if gpus == 1 else noise["steps"] == 8
