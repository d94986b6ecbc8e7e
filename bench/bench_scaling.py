"""Scaling benchmark: does a request cost in proportion to its size, end to end over HTTP?

Issue 26: the planner grew 15x from 1,000 to 10,000 node groups, mostly in garbage
collection: every full collection a big request sets off walks the whole app's objects too.
The server now freezes what startup built (`gc.freeze`, BATCHPLAN_GC_FREEZE, default on).

It starts two uvicorn workers side by side (check worker off), one as deployed and one with
BATCHPLAN_GC_FREEZE=false (the baseline), and sends each the same requests in turn, one at a
time, `--repeats` times each:

- mixed clusters of 1,000, 3,000 and 10,000 node groups (seeded random throughputs, caps and
  sizes; a dataset and an lr): the cost per node group should not grow with the count;
- homogeneous clusters of 1,000 to 10,000,000 GPUs: the cost should not grow at all;
- schedules (POST /v1/plans/schedule) with a ramp-up of 1,000, 10,000 and 100,000 stages over
  10^12 steps: the cost per stage should not grow.

Figures are the server's own time for a request, from its access-log line (`duration_ms`:
from the first byte of the request handed to the app to the last of the answer sent), the
median of the repeats (the two servers alternate, so a busy moment falls on both), and per
unit of size. Growth = time per unit at the largest size / at the smallest (1.0 is linear);
target < 1.5.

    .venv/bin/python bench/bench_scaling.py            # ~2 min
    .venv/bin/python bench/bench_scaling.py --quick    # ~40 s, 1,000 and 10,000 only

Always exits 0; the servers are killed on every exit path.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_line, table, verdict
from http_load import HOST, free_port, raw_request, server_log, start_server, stop_server, wait_ready

TARGET_GROWTH = 1.5


def node_groups(n: int) -> dict[str, Any]:
    rng = random.Random(n)
    groups = [
        {
            "name": f"g{i}",
            "num_nodes": rng.randint(1, 8),
            "gpus_per_node": rng.choice((1, 2, 4, 8)),
            "relative_throughput": rng.choice((0.5, 1.0, 1.5, 2.0, 3.0)),
            "max_micro_batch_size": rng.choice((None, 16, 32, 64)),
        }
        for i in range(n)
    ]
    world = sum(g["num_nodes"] * g["gpus_per_node"] for g in groups)
    return {
        "topology": {"node_groups": groups},
        "global_batch_size": world * 8,
        "dataset": {"num_samples": 10**9, "epochs": 3},
        "learning_rate": {"base_lr": 0.1, "warmup_epochs": 1},
    }


def gpus(n: int) -> dict[str, Any]:
    return {
        "topology": {"num_nodes": n // 8, "gpus_per_node": 8},
        "global_batch_size": n * 4,
        "dataset": {"num_samples": 10**9, "epochs": 3},
        "learning_rate": {"base_lr": 0.1, "warmup_epochs": 1},
    }


def stages(n: int) -> dict[str, Any]:
    """A ramp of `n` increments of 16 on 16 GPUs, each stage long enough for a step."""
    target = 16 * (n + 1)
    plan = {
        "topology": {"num_nodes": 2, "gpus_per_node": 8},
        "global_batch_size": target,
        "micro_batch_size": 1,
        "learning_rate": {"base_lr": 0.1, "warmup_steps": 100},
    }
    rampup = {"start_batch_size": 16, "batch_size_increment": 16, "rampup_samples": 2 * n * target}
    return {"plan": plan, "train_steps": 10**12, "rampup": rampup, "max_points": 5000}


CASES: list[tuple[str, str, str, Callable[[int], dict[str, Any]], tuple[int, ...], tuple[int, ...]]] = [
    # name, path, unit, body, sizes, quick sizes
    ("node groups", "/v1/plans", "group", node_groups, (1000, 3000, 10000), (1000, 10000)),
    ("GPUs", "/v1/plans", "plan", gpus, (1000, 100_000, 1_000_000, 10_000_000), (1000, 10_000_000)),
    ("schedule stages", "/v1/plans/schedule", "stage", stages, (1000, 10000, 100_000), (1000, 100_000)),
]


def post(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return raw_request(port, head.encode() + body, timeout=120.0)


def measure(server: tuple[Any, int], path: str, body: bytes) -> tuple[float, int, int]:
    """The server's seconds for one request (its access-log line), the status, the size."""
    log = server_log(server[1])
    seen = log.stat().st_size
    status, answer = post(server[1], path, body)
    for _ in range(100):  # the line is written as the answer ends: give it a moment
        with log.open("rb") as f:
            f.seek(seen)
            lines = [json.loads(line) for line in f.read().splitlines() if line.startswith(b"{")]
        durations = [line["duration_ms"] for line in lines if line.get("path") == path]
        if durations:
            return durations[-1] / 1e3, status, len(answer)
        time.sleep(0.01)
    raise RuntimeError(f"no access-log line for {path} in {log}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"bench_scaling  ({'quick' if args.quick else 'full'})  {machine_line()}")
    servers: dict[str, tuple[Any, int]] = {}
    rows: list[list[str]] = []
    verdicts: list[tuple[str, float, bool]] = []
    try:
        for label, freeze in (("frozen", "true"), ("baseline", "false")):
            port = free_port()
            env = {"BATCHPLAN_GC_FREEZE": freeze, "BATCHPLAN_MAX_BODY_BYTES": str(64 << 20)}
            env |= {"BATCHPLAN_LOG_FORMAT": "json", "BATCHPLAN_LOG_LEVEL": "info"}
            proc = start_server(port, None, env)
            servers[label] = (proc, port)
            wait_ready(port, proc)
        for name, path, unit, make, sizes, quick in CASES:
            per_unit: dict[str, list[float]] = {"frozen": [], "baseline": []}
            for size in quick if args.quick else sizes:
                body = json.dumps(make(size), separators=(",", ":")).encode()
                times: dict[str, list[float]] = {"frozen": [], "baseline": []}
                statuses, answer_bytes = set(), 0
                for server in servers.values():  # one warm-up each
                    measure(server, path, body)
                # A plan of a few hundred microseconds needs more repeats to outlast the noise.
                for _ in range(args.repeats * (5 if unit == "plan" else 1)):
                    for label, server in servers.items():
                        seconds, status, answer_bytes = measure(server, path, body)
                        times[label].append(seconds)
                        statuses.add(status)
                units = size if unit != "plan" else 1
                med = {label: statistics.median(values) for label, values in times.items()}
                for label, seconds in med.items():
                    per_unit[label].append(seconds / units)
                rows.append(
                    [
                        name,
                        f"{size:,}",
                        ",".join(map(str, sorted(statuses))),
                        f"{answer_bytes / 1e3:,.0f} kB",
                        f"{med['frozen'] * 1e3:,.1f}",
                        f"{med['frozen'] / units * 1e6:,.1f}",
                        f"{med['baseline'] * 1e3:,.1f}",
                        f"{med['baseline'] / units * 1e6:,.1f}",
                    ]
                )
            for label, values in per_unit.items():
                growth = (max(values) / min(values)) if unit == "plan" else values[-1] / values[0]
                verdicts.append((f"{name} ({label})", growth, growth < TARGET_GROWTH))
    except Exception as err:  # report, never fail the caller
        print(f"ERROR: {type(err).__name__}: {err}")
    finally:
        for proc, _ in servers.values():
            stop_server(proc)
    unit_names = "us per unit (group, stage; per plan for GPUs)"
    print(f"\nserver time per request, median of {args.repeats}; {unit_names}")
    headers = [
        "case",
        "size",
        "status",
        "answer",
        "frozen ms",
        "frozen us/unit",
        "baseline ms",
        "baseline us/unit",
    ]
    print(table(headers, rows))
    print(
        "\ngrowth: time per unit at the largest size / at the smallest (GPUs: slowest / fastest); "
        f"target < {TARGET_GROWTH}"
    )
    for label, growth, ok in verdicts:
        print(f"{label:32s} {growth:5.2f}  {verdict(ok) if 'baseline' not in label else '(baseline)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
