"""The throughput measurement (issue 38) on warm ranks: the built-in model's curve of 8 points.

    .venv/bin/python bench/bench_throughput.py [--runs 2] [--repeats 10] [--processes 4]

Starts `uvicorn app.main:app` with warm gloo ranks, submits `POST /v1/checks` with `throughput`
(micro-batches 1..128, the plan's cap 128) --runs times, after one discarded run, and reports
for each the time from submit to result (the check and the measurement), the measurement's own
`seconds`, and each point's samples/s; then the agreement of every point between the runs,
|a - b| / mean(a, b) for two runs (the largest relative deviation from the points' median for
more). Targets: the curve in at most 5 s on warm ranks; the runs within 5 % per point on a quiet
machine (the load average at the start is printed: on a shared 2-core host the figures move with
it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT  # noqa: F401  (puts the repository on sys.path)

from tests.support.polling import run_check
from tests.support.servers import serve

SIZES = [1, 2, 4, 8, 16, 32, 64, 128]


def body(repeats: int) -> dict[str, Any]:
    return {
        "plan": {
            "topology": {"num_nodes": 1, "gpus_per_node": 2},
            "global_batch_size": 64,
            "max_micro_batch_size": 128,
        },
        "throughput": {"micro_batch_sizes": SIZES, "repeats": repeats},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--processes", type=int, default=4)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}, {os.cpu_count()} cores")
    env = {"BATCHPLAN_PROCESSES_PER_HOST": str(args.processes), "CUDA_VISIBLE_DEVICES": ""}
    curves: list[list[float]] = []
    with serve(env, limit_s=120) as server:
        server.wait_warm(args.processes, timeout=120)
        run_check(server.client, body(args.repeats), timeout=120)  # discarded: first use of the ranks
        for run in range(args.runs):
            started = time.perf_counter()
            job = run_check(server.client, body(args.repeats), timeout=120)
            wall = time.perf_counter() - started
            assert job["status"] == "succeeded", job
            t = job["result"]["throughput"]
            rates = [p["samples_per_s"] for p in t["points"]]
            curves.append(rates)
            ok = "PASS" if wall <= 5 else "MISS"
            print(
                f"run {run + 1}: submit to result {wall:.2f} s, measurement {t['seconds']:.2f} s "
                f"[{ok}: <= 5 s]; fastest {t['fastest_micro_batch_size']}, "
                f"knee {t['knee_micro_batch_size']}; threads {t['threads']}"
            )
            for p in t["points"]:
                print(
                    f"  b={p['micro_batch_size']:>4} {p['step_time_s'] * 1e6:9.1f} us  "
                    f"{p['samples_per_s']:>12.0f} samples/s  spread {p['spread'] * 100:5.1f}%  "
                    f"x{p['micro_steps_per_repeat']}"
                )
    print(f"load average at end: {os.getloadavg()}")
    if len(curves) < 2:
        return
    worst = 0.0
    print("per-point agreement between the runs:")
    for i, b in enumerate(SIZES):
        values = [c[i] for c in curves]
        if len(values) == 2:
            deviation = abs(values[0] - values[1]) / statistics.mean(values)
        else:
            middle = statistics.median(values)
            deviation = max(abs(v - middle) / middle for v in values)
        worst = max(worst, deviation)
        print(f"  b={b:>4} {deviation * 100:5.1f}%")
    print(
        f"worst point {worst * 100:.1f}% [{'PASS' if worst <= 0.05 else 'MISS'}: <= 5 % on a quiet machine]"
    )


if __name__ == "__main__":
    main()
