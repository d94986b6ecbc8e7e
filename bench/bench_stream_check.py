"""The stream check over HTTP on warm ranks: 4 ranks x 2 DataLoader workers over a stream of
4,096 samples in 16 shards (global batch 64, micro-batch 16: 64 optimizer steps, every step's
gradient held against the single-process mean, and the four reading controls), one splitter
after another, rounds interleaved, on one server.

    .venv/bin/python bench/bench_stream_check.py [--runs 5] [--splitters webdataset,hf_datasets,rank_worker]

Starts `uvicorn app.main:app` with 4 warm rank processes (bench_checks.warm_worker), submits
each splitter's check once not counted (its ranks import the library: `datasets` takes seconds
a rank), then `--runs` of each. Prints each median with the last check's laps, and PASS/MISS
against the target: a warm stream check answers in at most 2 s. Each check starts 4 x 2 DataLoader
worker processes for the plan's reading and as many for each control that reads differently.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_line, verdict
from bench_checks import check_over_http, warm_worker

TARGET_S = 2.0


def body(splitter: str) -> dict[str, Any]:
    dataset = {
        "kind": "stream",
        "num_samples": 4096,
        "num_shards": 16,
        "splitter": splitter,
        "num_workers": 2,
    }
    plan = {
        "topology": {"num_nodes": 1, "gpus_per_node": 4},
        "global_batch_size": 64,
        "micro_batch_size": 16,
        "dataset": dataset,
    }
    return {"plan": plan, "dtype": "float64"}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--splitters", default="webdataset,hf_datasets,rank_worker")
    args = parser.parse_args()
    splitters = args.splitters.split(",")
    print(machine_line())
    times: dict[str, list[float]] = {s: [] for s in splitters}
    last: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp, warm_worker(tmp) as client:
        for splitter in splitters:
            check_over_http(client, body(splitter))  # not counted: the first imports its library
        for _ in range(args.runs):
            for splitter in splitters:
                elapsed, result = check_over_http(client, body(splitter))
                if not result.get("passed"):
                    raise SystemExit(f"the {splitter} stream check did not pass: {result}")
                times[splitter].append(elapsed)
                last[splitter] = result
    for splitter in splitters:
        median = statistics.median(times[splitter])
        laps = last[splitter].get("timings_s", {})
        shown = ", ".join(
            f"{k} {laps[k]:.3f}" for k in ("read", "epoch", "controls", "reference") if k in laps
        )
        print(
            f"{splitter:<12} 4 ranks x 2 workers, 4096 samples: median {median:.3f} s of {args.runs} "
            f"(last: {shown} s); target <= {TARGET_S} s: {verdict(median <= TARGET_S)}"
        )
    print(machine_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
