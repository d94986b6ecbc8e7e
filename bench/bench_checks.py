"""End-to-end gradient checks: warm ranks over HTTP against a cold torchrun.

    .venv/bin/python bench/bench_checks.py [--runs 7] [--processes 8] [--json out.json]

Starts `uvicorn app.main:app` with warm rank processes, submits `POST /v1/checks` for 2, 4 and
8 replicas and polls until the result (the median of --runs, after one discarded run), the
synthetic workload beside the `tokens` one (the same split in tokens, normalised by tokens), then
runs the same rank program under a cold `torchrun` for 8 replicas in the same run. Mesh checks
(4 ranks each: dp x tp 2 x 2, pp 2 x dp 2, FSDP 4) are timed the same way, warm against a cold
torchrun of the same rank program. A run (the OpenAPI example `run`: 4 replicas, 20 optimizer
steps of a recipe over two epochs, every run-level control) is timed warm, against the one-step
check of 4 replicas and a cold torchrun of the same request; so is a check of 262,144 samples (2
replicas, every control that applies). Each warm check is also printed as a fraction of its cold
torchrun. For rank time without HTTP, and this tree against another revision side by side in the
same run, see bench/profile_checks.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from _common import ROOT

from app.contract.rank_command import torchrun_argv
from app.ports import free_port
from app.schemas.check_examples import CHECK_EXAMPLES
from tests.support.servers import serve


def plan(replicas: int) -> dict[str, Any]:
    return {
        "topology": {"num_nodes": 1, "gpus_per_node": replicas},
        "global_batch_size": 8 * replicas,
        "micro_batch_size": 4,
    }


SEQUENCE_LENGTH = 16


def token_plan(replicas: int) -> dict[str, Any]:
    """The same split in tokens, normalised by tokens: the `tokens` workload (a tiny language
    model on sequences of uneven valid length, with its three controls)."""
    return {
        "topology": {"num_nodes": 1, "gpus_per_node": replicas},
        "sequence_length": SEQUENCE_LENGTH,
        "global_batch_tokens": 8 * replicas * SEQUENCE_LENGTH,
        "micro_batch_tokens": 4 * SEQUENCE_LENGTH,
        "loss_normalization": "token",
    }


def timed(client: httpx.Client, body: dict[str, Any], runs: int) -> tuple[list[float], dict[str, Any]]:
    """`runs` checks of `body` after one not counted (the first group of a size forms it)."""
    check_over_http(client, body)
    times, result = [], {}
    for _ in range(runs):
        elapsed, result = check_over_http(client, body)
        times.append(elapsed)
    return times, result


# Mesh checks: 4 ranks, one real process per mesh rank, 4 micro-batches (the pipeline's schedule).
MESHES = {
    "dp2_x_tp2": {"tensor": 2},
    "pp2_x_dp2": {"pipeline": 2},
    "fsdp4": {"data_parallel_shard": 4},
}


def mesh_plan(parallelism: dict[str, int]) -> dict[str, Any]:
    return {
        "topology": {"num_nodes": 1, "gpus_per_node": 4},
        "micro_batch_size": 3,
        "gradient_accumulation_steps": 4,
        "parallelism": parallelism,
    }


def warm_runs(client: httpx.Client, body: dict[str, Any], runs: int) -> dict[str, Any]:
    times, result = timed(client, body, runs)
    return {
        "median_s": round(statistics.median(times), 4),
        "min_s": round(min(times), 4),
        "max_s": round(max(times), 4),
        "processes": result["processes"],
        "controls": len(result["controls"]),
        "rel_l2": result["rel_l2"],
        "mesh": result.get("mesh"),
        "wrapper": result.get("wrapper"),
        "rank_timings_s": result["timings_s"],
        "run_controls": sorted(result.get("control_trajectories") or {}),
    }


def check_over_http(
    client: httpx.Client, body: dict[str, Any], *, wait: float | None = 30.0
) -> tuple[float, dict[str, Any]]:
    """POST /v1/checks, then GET its Location until it has finished, asking again 2 ms after
    each answer that it has not: (seconds, result). `wait` is each GET's ?wait=: 30, answered
    once the check finishes; 0, at once (a poll, whose CPU a small machine's ranks miss); None,
    no parameter (the server holds an unfinished check's answer up to 25 ms; a revision from
    before ?wait answers at once, as it does to any wait)."""
    started = time.perf_counter()
    response = client.post("/v1/checks", json=body)
    response.raise_for_status()
    location = response.headers["location"]
    params = {} if wait is None else {"wait": wait}
    while True:
        job = client.get(location, params=params).json()
        if job["status"] not in ("queued", "running"):
            elapsed = time.perf_counter() - started
            if job["status"] != "succeeded" or not job["result"]["passed"]:
                raise RuntimeError(f"check failed: {job}")
            return elapsed, job["result"]
        time.sleep(0.002)


# A check of 262,144 samples (2 replicas, micro-batch 32,768, accumulation 4, summed losses: four
# controls run), and its goal: at most 3 s warm.
LARGE_REQUEST: dict[str, Any] = {
    "plan": {
        "topology": {"num_nodes": 1, "gpus_per_node": 2},
        "global_batch_size": 1 << 18,
        "micro_batch_size": 1 << 15,
        "loss_reduction": "sum",
    }
}

# 4 replicas, accumulation 2, 20 optimizer steps over two epochs: every run-level control runs.
RUN_REQUEST: dict[str, Any] = CHECK_EXAMPLES["run"]["value"]


@contextlib.contextmanager
def warm_worker(folder: str, processes: int = 4) -> Iterator[httpx.Client]:
    """A worker server on CPU with `processes` warm ranks, its jobs under `folder`: its client."""
    env = {
        "BATCHPLAN_WORKER_ENABLED": "true",
        "BATCHPLAN_PROCESSES_PER_HOST": str(processes),
        "BATCHPLAN_JOBS_DB": str(Path(folder) / "jobs.sqlite3"),
        "BATCHPLAN_LOG_LEVEL": "warning",
        "CUDA_VISIBLE_DEVICES": "",
    }
    with serve(env, limit_s=120) as server:
        server.client.timeout = httpx.Timeout(60)
        server.wait_warm(processes, timeout=600)
        yield server.client


def cold_torchrun(
    replicas: int, body: dict[str, Any] | None = None, request_body: dict[str, Any] | None = None
) -> tuple[float, dict[str, Any]]:
    request = json.dumps(request_body or {"plan": body or plan(replicas)})
    started = time.perf_counter()
    completed = subprocess.run(
        torchrun_argv(request, nproc_per_node=replicas, rdzv_endpoint=f"127.0.0.1:{free_port()}"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,  # its stderr says why, below
    )
    elapsed = time.perf_counter() - started
    if completed.returncode != 0:
        raise RuntimeError(
            f"cold torchrun of {request} exited {completed.returncode}:\n{completed.stderr[-4000:]}"
        )
    line = next(line for line in completed.stdout.splitlines() if line.startswith("{"))
    return elapsed, json.loads(line)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument(
        "--processes", type=int, default=8, help="warm rank processes (BATCHPLAN_PROCESSES_PER_HOST)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        env = {
            "BATCHPLAN_JOBS_DB": str(Path(tmp) / "jobs.sqlite3"),
            "BATCHPLAN_PROCESSES_PER_HOST": str(args.processes),
        }
        figures: dict[str, Any] = {
            "processes_per_host": args.processes,
            "runs": args.runs,
            "cpus": os.cpu_count(),
        }
        started = time.perf_counter()
        with serve(env, limit_s=120) as server:
            client = server.client
            client.timeout = httpx.Timeout(60)
            server.wait_warm(args.processes, timeout=600)
            figures["server_start_until_warm_s"] = round(time.perf_counter() - started, 3)
            warm: dict[str, Any] = {}
            for replicas in (2, 4, 8):
                times, result = timed(client, {"plan": plan(replicas)}, args.runs)
                token_times, token_result = timed(client, {"plan": token_plan(replicas)}, args.runs)
                warm[str(replicas)] = {
                    "median_s": round(statistics.median(times), 4),
                    "min_s": round(min(times), 4),
                    "max_s": round(max(times), 4),
                    "processes": result["processes"],
                    "replicas_per_process": result["replicas_per_process"],
                    "controls": len(result["controls"]),
                    "rel_l2": result["rel_l2"],
                    "tokens_median_s": round(statistics.median(token_times), 4),
                    "tokens_controls_detected": len([c for c in token_result["controls"] if c["detected"]]),
                    "tokens_rel_l2": token_result["rel_l2"],
                }
            figures["warm_http"] = warm
            mesh_warm = {
                name: warm_runs(client, {"plan": mesh_plan(p)}, args.runs) for name, p in MESHES.items()
            }
            figures["mesh_warm_http"] = mesh_warm
            run = figures["run_warm_http"] = warm_runs(client, RUN_REQUEST, args.runs)
            large = figures["large_warm_http"] = warm_runs(client, LARGE_REQUEST, args.runs)
    cold_s, cold = cold_torchrun(8)
    figures["cold_torchrun_8"] = {"wall_s": round(cold_s, 3), "passed": cold["passed"]}
    figures["speedup_8"] = round(cold_s / warm["8"]["median_s"], 1)
    mesh_cold = {}
    for name, parallelism in MESHES.items():
        wall, result = cold_torchrun(4, mesh_plan(parallelism))
        mesh_cold[name] = {"wall_s": round(wall, 3), "passed": result["passed"], "mesh": result["mesh"]}
    figures["mesh_cold_torchrun"] = mesh_cold
    run_cold_s, run_cold = cold_torchrun(4, request_body=RUN_REQUEST)
    figures["run_cold_torchrun_4"] = {"wall_s": round(run_cold_s, 3), "passed": run_cold["passed"]}
    large_cold_s, large_cold = cold_torchrun(2, request_body=LARGE_REQUEST)
    figures["large_cold_torchrun_2"] = {"wall_s": round(large_cold_s, 3), "passed": large_cold["passed"]}

    print(
        f"warm ranks ({args.processes} processes, {os.cpu_count()} CPUs), POST /v1/checks until the result, "
        f"median of {args.runs}:"
    )
    print("| replicas | processes | median s | min s | max s | tokens workload median s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for replicas, row in warm.items():
        print(
            f"| {replicas} | {row['processes']} | {row['median_s']} | {row['min_s']} | {row['max_s']} "
            f"| {row['tokens_median_s']} |"
        )
    print(f"cold torchrun, 8 processes, same rank program: {cold_s:.2f} s")
    met = warm["8"]["median_s"] <= 1 and figures["speedup_8"] >= 10
    print(
        f"warm 8-replica check is {figures['speedup_8']}x faster than cold "
        f"(goals: <= 1 s and >= 10x: {'met' if met else 'MISSED'})"
    )
    print("mesh checks (4 ranks, 4 micro-batches), warm POST /v1/checks against a cold torchrun:")
    print("| mesh | wrapper | warm median s | step s | controls s | cold torchrun s |")
    print("|---|---|---:|---:|---:|---:|")
    for name, row in mesh_warm.items():
        laps = row["rank_timings_s"]
        print(
            f"| {name} | {row['wrapper']} | {row['median_s']} | {laps['step']} | {laps['controls']} | "
            f"{mesh_cold[name]['wall_s']} |"
        )
    one_step = warm["4"]["median_s"]
    print(
        f"a run of {RUN_REQUEST['steps']} optimizer steps, 4 replicas, run-level controls "
        f"{', '.join(run['run_controls'])}, "
        f"warm POST /v1/checks until the result, median of {args.runs}:"
    )
    print(
        "| warm median s | min s | max s | run s | reference and controls s | vs one step | cold torchrun s |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    laps = run["rank_timings_s"]
    print(
        f"| {run['median_s']} | {run['min_s']} | {run['max_s']} | {laps['run']} | {laps['run_reference']} "
        f"| {run['median_s'] / one_step:.1f}x | {run_cold_s:.2f} ({run_cold_s / run['median_s']:.1f}x) |"
    )
    print(f"warm 20-step run with every control: goal <= 1 s: {'met' if run['median_s'] <= 1 else 'MISSED'}")
    laps = large["rank_timings_s"]
    print(
        f"a check of 262,144 samples (2 replicas, 4 controls), warm median {large['median_s']} s "
        f"(controls {laps['controls']} s of the rank's {laps.get('rank_total', '-')} s); cold torchrun "
        f"{large_cold_s:.2f} s: warm/cold {large['median_s'] / large_cold_s:.4f}; goals <= 3 s and <= 0.01: "
        f"{'met' if large['median_s'] <= 3 and large['median_s'] <= 0.01 * large_cold_s else 'MISSED'}"
    )
    ratios = {"8 replicas": warm["8"]["median_s"] / cold_s}
    ratios |= {name: row["median_s"] / mesh_cold[name]["wall_s"] for name, row in mesh_warm.items()}
    print(
        "warm / cold torchrun of the same rank program (goal <= 0.01 each): "
        + ", ".join(f"{name} {ratio:.4f}" for name, ratio in ratios.items())
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
