"""Checks that span processes started elsewhere: two servers on this machine joining one
2-node check over HTTP, a server killed mid-check, and the rank program under torchrun: a run
of several steps across two torchrun nodes, each node printing its verdict (and on GPUs, one
node of NCCL ranks)."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.bodies import RUN_RECIPE, fast_and_slow
from support.polling import wait_check, wait_for
from support.processes import alive
from support.servers import Server, serve, worker_env

from app.contract.rank_command import torchrun_argv
from app.ports import free_port

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
PLAN = {"topology": {"num_nodes": 2, "gpus_per_node": 2}, "global_batch_size": 32, "micro_batch_size": 4}


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Server]]:
    """Two servers, started together; each test waits for their ranks."""
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(
                serve(worker_env(tmp_path / f"{n}.sqlite3"), tmp_path / f"{n}.log", live=False)
            )
            for n in "ab"
        ]


def test_two_servers_join_one_two_node_check_and_a_killed_server_leaves_nothing(
    servers: list[Server], tmp_path: Path
) -> None:
    a, b = servers
    a.wait_warm(2)
    b.wait_warm(2)
    rendezvous = {"endpoint": f"127.0.0.1:{free_port()}", "nnodes": 2, "run_id": "two-node-check"}
    locations = []
    for server in (a, b):
        response = server.client.post("/v1/checks", json={"plan": PLAN, "rendezvous": rendezvous})
        assert response.status_code == 202, response.text
        locations.append(response.headers["location"])
    jobs = [
        wait_check(server.client, loc, ("succeeded", "failed"))
        for server, loc in zip(servers, locations, strict=True)
    ]
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
    wait_check(a.client, location, ("running",))
    ranks = [p["pid"] for p in a.client.get("/v1/host").json()["processes"]]
    a.process.kill()
    a.process.wait()
    wait_for(lambda: not [pid for pid in ranks if alive(pid)], "rank processes to end with their server", 10)
    with serve(worker_env(tmp_path / "a.sqlite3"), tmp_path / "restarted.log", limit_s=60) as restarted:
        job = restarted.client.get(location).json()
        assert job["status"] == "failed" and "server stopped while this check was running" in job["error"]
        assert restarted.client.get(locations[0]).json()["result"] == results[0]

        # A graceful stop ends every rank process too.
        ranks = restarted.wait_warm(2)["processes"]
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


def _on_two_torchrun_nodes(request: str, *, timeout: int) -> list[str]:
    """The rank program on two torchrun "nodes" of one process each on this host, each told to
    print rank 0's result (--result-on-every-node): what each node printed, once both exit 0."""
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [
        subprocess.Popen(
            torchrun_argv(
                request, nproc_per_node=1, nnodes=2, rdzv_endpoint=endpoint, extra=["--result-on-every-node"]
            ),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        outputs = [node.communicate(timeout=timeout) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], [err[-2000:] for _, err in outputs]
    return [out for out, _ in outputs]


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


def test_the_rank_program_runs_the_same_run_across_two_torchrun_nodes() -> None:
    """The multi-node path: two torchrun nodes of one process each, an uneven plan; each node
    prints rank 0's result, once, and it is the run the warm ranks check. A launch script on
    either node (the preflight) reads the same verdict from its own output. (One two-node
    torchrun serves both: the check's verdict and the run are one result, printed by one path.)"""
    plan = {**fast_and_slow(3.0, 24), "learning_rate": RUN_RECIPE}
    request = json.dumps({"plan": plan, "steps": 4})
    outputs = _on_two_torchrun_nodes(request, timeout=240)
    printed = [[json.loads(x) for x in out.splitlines() if x.startswith("{")] for out in outputs]
    assert [len(r) for r in printed] == [1, 1], outputs
    results = [r[0] for r in printed]
    assert results[0] == results[1]
    result = results[0]
    assert result["passed"] and result["nnodes"] == 2 and result["trajectory_matches"]
    # What the one-node torchrun of this plan showed (its own test once; the one-node launch
    # of the same rank program, rank 0 alone printing, is test_token_check.py's torchrun run).
    assert result["split"] == "proportional" and result["processes"] == 2
    assert any(c["name"] == "unweighted_mean" and c["detected"] for c in result["controls"])
    assert [s["epoch"] for s in result["trajectory"]] == [0, 0, 1, 1]
    assert {c["name"] for c in result["controls"]} >= {"scheduler_per_process", "set_epoch_missing"}
