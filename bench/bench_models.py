"""Registered check models over HTTP: check time, noise-scale accuracy, the micro-batch search.

    .venv/bin/python bench/bench_models.py [--runs 5] [--seeds 32] [--json out.json]

Starts `uvicorn app.main:app` with 4 warm rank processes and the example models `mlp`,
`quadratic`, `wide_mlp` and a Transformers GPT-2 (`gpt2`, tiny, random-init) registered,
then measures, each against a baseline from the same run:

1. Check time on 4 replicas: the synthetic model (baseline), `mlp` and `gpt2`, each without
   the noise scale and with its default 8 noise-scale steps (median of --runs after one
   discarded run, which for `gpt2` pays the transformers import in every rank).
2. The noise-scale estimate of `quadratic` (global batch 128 on 4 replicas) over 8, 16 and 32
   steps and seeds 0..--seeds−1, against the closed form of the dataset each seed builds.
3. The micro-batch search of `wide_mlp` in 4 MiB (global batch 512 on 4 replicas), against
   a linear scan from micro-batch 1 upward with the same probe, run in this process.

Not a test: it prints figures and ratios and always exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
import torch
from bench_checks import check_over_http
from models_report import MEMORY_BYTES, REPLICAS, report

from app.core.split.micro_batch_search import budget_bytes
from app.worker.measure.memory import probe
from app.worker.training.workload import Registered
from app.worker.zoo import example_models
from tests.support.servers import Server, serve

MODELS = {name: f"app.worker.example_models:{name}" for name in ("mlp", "quadratic", "wide_mlp")}
MODELS["gpt2"] = "app.worker.example_hf_models:gpt2"
NOISE_STEPS = (8, 16, 32)
SAFETY_MARGIN = 0.1


def topology() -> dict[str, int]:
    return {"num_nodes": 1, "gpus_per_node": REPLICAS}


CHECK_PLAN = {"topology": topology(), "global_batch_size": 64, "micro_batch_size": 8}
QUADRATIC_PLAN = {"topology": topology(), "global_batch_size": 128, "micro_batch_size": 32}
SEARCH_PLAN = {"topology": topology(), "global_batch_size": 512}


def wait_until_warm(server: Server) -> None:
    """Until the ranks are warm and every registered model has been built (loaded not null)."""
    host = server.wait_warm(REPLICAS, models=True, timeout=300)
    broken = [m["name"] for m in host["models"] if not m["loaded"]]
    if broken:
        raise RuntimeError(f"models failed to load: {broken}")


def check_times(client: httpx.Client, runs: int) -> dict[str, Any]:
    cases = {
        "synthetic": {"plan": CHECK_PLAN},
        "mlp_noise0": {"plan": CHECK_PLAN, "model": "mlp", "noise_scale": {"steps": 0}},
        "mlp_noise8": {"plan": CHECK_PLAN, "model": "mlp"},
        "gpt2_noise0": {"plan": CHECK_PLAN, "model": "gpt2", "noise_scale": {"steps": 0}},
        "gpt2_noise8": {"plan": CHECK_PLAN, "model": "gpt2"},
    }
    out: dict[str, Any] = {}
    for name, body in cases.items():
        check_over_http(client, body)  # first run of this model: not counted
        times, noise = [], []
        for _ in range(runs):
            elapsed, result = check_over_http(client, body)
            times.append(elapsed)
            if "noise_scale" in result["timings_s"]:
                noise.append(result["timings_s"]["noise_scale"])
        out[name] = {
            "median_s": round(statistics.median(times), 4),
            "min_s": round(min(times), 4),
            "max_s": round(max(times), 4),
            "noise_scale_s": round(statistics.median(noise), 4) if noise else None,
        }
    base = out["synthetic"]["median_s"]
    for row in out.values():
        row["vs_synthetic"] = round(row["median_s"] / base, 2)
    return out


def noise_accuracy(client: httpx.Client, seeds: int) -> dict[str, Any]:
    zeros = torch.zeros(example_models.QUADRATIC_DIM)
    # The factory gets the check's seed, so each seed is its own dataset with its own truth.
    data = example_models.quadratic_data
    truth = {s: example_models.quadratic_noise_scale(data(s), zeros) for s in range(seeds)}
    body = {"plan": QUADRATIC_PLAN, "model": "quadratic"}
    check_over_http(client, {**body, "noise_scale": {"steps": NOISE_STEPS[0]}})  # warm-up
    out: dict[str, Any] = {
        "truth_seed0": round(truth[0], 4),
        "truth_min": round(min(truth.values()), 4),
        "truth_max": round(max(truth.values()), 4),
        "seeds": seeds,
        "by_steps": {},
    }
    for steps in NOISE_STEPS:
        estimates, errors, relative, covered, seconds, reliable = [], [], [], 0, [], 0
        for seed in range(seeds):
            _, result = check_over_http(client, {**body, "noise_scale": {"steps": steps}, "seed": seed})
            noise = result["noise_scale"]
            seconds.append(result["timings_s"]["noise_scale"])
            estimate, stderr = noise["b_simple"], noise["stderr"]
            reliable += bool(noise.get("reliable"))
            if estimate is None:
                continue  # no estimate: the "estimates" column counts the runs that gave one
            estimates.append(estimate)
            errors.append(abs(estimate - truth[seed]) / truth[seed])
            if stderr is not None:
                relative.append(noise["relative_stderr"])
                covered += abs(estimate - truth[seed]) <= 2 * stderr
        out["by_steps"][str(steps)] = {
            "estimates": len(estimates),
            "reliable": reliable,
            "median_estimate": round(statistics.median(estimates), 3) if estimates else None,
            "mean_abs_rel_error": round(statistics.fmean(errors), 4) if errors else None,
            "median_relative_stderr": round(statistics.median(relative), 4) if relative else None,
            "coverage_2se": round(covered / seeds, 3),
            "noise_scale_s": round(statistics.median(seconds), 4),
        }
    return out


def linear_scan(budget: int) -> dict[str, Any]:
    """The baseline: probe 1, 2, 3, … until a size does not fit (same probe, same stop level)."""
    workload = Registered("wide_mlp", MODELS["wide_mlp"])
    device = torch.device("cpu")
    model = workload.module(None, device)
    probe(model, workload.dataset, workload.loss_fn, 1, device, stop_above_bytes=budget)  # warm-up
    started = time.perf_counter()
    size, largest = 1, 0
    while True:
        peak, error = probe(model, workload.dataset, workload.loss_fn, size, device, stop_above_bytes=budget)
        if error is not None or peak > budget:
            break
        largest, size = size, size + 1
    return {"max_micro_batch_size": largest, "trials": size, "seconds": time.perf_counter() - started}


def micro_batch_search(client: httpx.Client, runs: int) -> dict[str, Any]:
    body = {
        "plan": SEARCH_PLAN,
        "model": "wide_mlp",
        "noise_scale": {"steps": 0},
        "fit_micro_batch": {"memory_bytes": MEMORY_BYTES, "safety_margin": SAFETY_MARGIN},
    }
    check_over_http(client, body)  # first search in the rank: not counted
    searches = [check_over_http(client, body)[1]["micro_batch_search"] for _ in range(runs)]
    budget = budget_bytes(MEMORY_BYTES, SAFETY_MARGIN)
    scans = [linear_scan(budget) for _ in range(runs)]
    last, scan = searches[-1], scans[-1]
    planned = last["planned"]
    search_s = statistics.median(s["seconds"] for s in searches)
    scan_s = statistics.median(s["seconds"] for s in scans)
    return {
        "budget_bytes": budget,
        "search": {
            "max_micro_batch_size": last["max_micro_batch_size"],
            "trials": len(last["trials"]),
            "seconds": round(search_s, 4),
            "same_every_run": len({(s["max_micro_batch_size"], len(s["trials"])) for s in searches}) == 1,
            "planned_micro_batch_sizes": planned["micro_batch_sizes"],
            "planned_accumulation": planned["gradient_accumulation_steps"],
        },
        "linear_scan": {
            "max_micro_batch_size": scan["max_micro_batch_size"],
            "trials": scan["trials"],
            "seconds": round(scan_s, 4),
        },
        "same_size": scan["max_micro_batch_size"] == last["max_micro_batch_size"],
        "trials_ratio": round(scan["trials"] / len(last["trials"]), 2),
        "seconds_ratio": round(scan_s / search_s, 2) if search_s > 0 else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5, help="timed runs per case, after one discarded")
    parser.add_argument("--seeds", type=int, default=32, help="seeds per noise-scale step count")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as in the rank processes, for the in-process linear scan

    began = time.perf_counter()
    figures: dict[str, Any] = {"runs": args.runs, "cpus": os.cpu_count(), "processes_per_host": REPLICAS}
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            "BATCHPLAN_JOBS_DB": str(Path(tmp) / "jobs.sqlite3"),
            "BATCHPLAN_PROCESSES_PER_HOST": str(REPLICAS),
            "BATCHPLAN_CHECK_MODELS": ",".join(f"{name}={target}" for name, target in MODELS.items()),
        }
        try:
            started = time.perf_counter()
            with serve(env, limit_s=120) as server:
                client = server.client
                client.timeout = httpx.Timeout(120)
                wait_until_warm(server)
                figures["server_start_until_warm_s"] = round(time.perf_counter() - started, 3)
                figures["check_time"] = check_times(client, args.runs)
                figures["noise_accuracy"] = noise_accuracy(client, args.seeds)
                figures["micro_batch_search"] = micro_batch_search(client, args.runs)
        except Exception as err:  # a bench never fails: say what broke and exit 0
            print(f"bench_models: {type(err).__name__}: {err}", file=sys.stderr)
            return 0
    figures["bench_s"] = round(time.perf_counter() - began, 1)
    report(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
