"""The throughput measurement (issue 38) on warm ranks: the built-in model's curve of 8 points.

    .venv/bin/python bench/bench_throughput.py [--trials 3] [--runs 2] [--repeats 10] [--processes 4]

Starts `uvicorn app.main:app` with warm gloo ranks, submits `POST /v1/checks` with `throughput`
(micro-batches 1..128, the plan's cap 128) --runs times, after one discarded run, and reports
for each the time from submit to result (the check and the measurement), the measurement's own
`seconds`, each point's samples/s, its repeats and whether it is flagged noisy, and the
warnings; `--trials` times (default 3) it compares `--runs` curves: the agreement of every point,
|a - b| / mean(a, b) for two runs (the largest relative deviation from the points' median for
more). Targets: the curve in at most 5 s on warm ranks; the two runs of every trial within 5 %
at every point, three trials in a row, on a quiet machine (the load average at the start is
printed: on a shared 2-core host the figures move with it).
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


def _run(server: Any, repeats: int, label: str) -> list[float]:
    """One curve: its timing line and its points; its samples/s, smallest micro-batch first."""
    started = time.perf_counter()
    job = run_check(server.client, body(repeats), timeout=120)
    wall = time.perf_counter() - started
    assert job["status"] == "succeeded", job
    t = job["result"]["throughput"]
    ok = "PASS" if wall <= 5 else "MISS"
    print(
        f"{label}: submit to result {wall:.2f} s, measurement {t['seconds']:.2f} s "
        f"[{ok}: <= 5 s]; fastest {t['fastest_micro_batch_size']}, "
        f"knee {t['knee_micro_batch_size']}; threads {t['threads']}"
    )
    for p in t["points"]:
        noisy = f"  repeats {p['repeats']}{'  NOISY' if p['noisy'] else ''}" if "noisy" in p else ""
        print(
            f"  b={p['micro_batch_size']:>4} {p['step_time_s'] * 1e6:9.1f} us  "
            f"{p['samples_per_s']:>12.0f} samples/s  spread {p['spread'] * 100:5.1f}%  "
            f"x{p['micro_steps_per_repeat']}{noisy}"
        )
    for warning in t.get("warnings") or []:
        print(f"  warning: {warning}")
    return [p["samples_per_s"] for p in t["points"]]


def _worst(curves: list[list[float]]) -> float:
    """The largest per-point disagreement: |a - b| / mean(a, b) for two curves (the largest
    relative deviation from the points' median for more)."""
    worst = 0.0
    for values in zip(*curves, strict=True):
        if len(values) == 2:
            deviation = abs(values[0] - values[1]) / statistics.mean(values)
        else:
            middle = statistics.median(values)
            deviation = max(abs(v - middle) / middle for v in values)
        worst = max(worst, deviation)
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3, help="pairs of runs, each pair compared")
    parser.add_argument("--runs", type=int, default=2, help="curves a trial compares")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--processes", type=int, default=4)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}, {os.cpu_count()} cores")
    env = {"BATCHPLAN_PROCESSES_PER_HOST": str(args.processes), "CUDA_VISIBLE_DEVICES": ""}
    worst: list[float] = []
    with serve(env, limit_s=120) as server:
        server.wait_warm(args.processes, timeout=120)
        run_check(server.client, body(args.repeats), timeout=120)  # discarded: first use of the ranks
        for trial in range(args.trials):
            curves = [_run(server, args.repeats, f"trial {trial + 1} run {r + 1}") for r in range(args.runs)]
            if len(curves) < 2:
                continue
            worst.append(_worst(curves))
            verdict = "PASS" if worst[-1] <= 0.05 else "MISS"
            print(f"trial {trial + 1}: worst point {worst[-1] * 100:.1f}% [{verdict}: <= 5 % at every point]")
    print(f"load average at end: {os.getloadavg()}")
    if worst:
        within = sum(w <= 0.05 for w in worst)
        print(
            f"{within} of {len(worst)} trials within 5 % at every point "
            f"[{'PASS' if within == len(worst) >= 3 else 'MISS'}: three in a row on a quiet machine]; "
            f"worst points {', '.join(f'{w * 100:.1f}%' for w in worst)}"
        )


if __name__ == "__main__":
    main()
