"""Refusals of a large cluster against its plan: is every 4xx about a 10,000-node-group request
within 2x of the plan of the same cluster, end to end over HTTP?

Issue 40: an infeasible request with 10,000 node groups took about 1.1 s over HTTP where the
core's own suggestions took 20 ms. The GPU-count suggestions searched every node group's fields
(a micro-batch of 3 on 10,000 groups: 3.7 s against 0.45 s for the plan); they now search a
bounded number of groups (app.core.errors.suggestions.GROUPS_SEARCHED_ON_LARGE_CLUSTERS).

One uvicorn worker (check worker off, body limit 64 MiB), the cluster of bench_scaling.py's
10,000 node groups (seeded), and each case sent `--repeats` times in turn after a warm-up: the
feasible plan (the baseline) and every kind of refusal of the same body, changed in one field.
The figure is the server's own time per request from its access-log line (`duration_ms`), the
median of the repeats, and its ratio to the plan's median; target <= 2.

    .venv/bin/python bench/bench_refusals.py            # ~1 min
    .venv/bin/python bench/bench_refusals.py --repeats 3

Always exits 0; the server is killed on every exit path.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_line, table, verdict
from bench_scaling import measure, node_groups
from http_load import free_port, start_server, stop_server, wait_ready

TARGET = 2.0
GROUPS = 10_000

Body = dict[str, Any]


def _world(body: Body) -> int:
    return sum(g["num_nodes"] * g["gpus_per_node"] for g in body["topology"]["node_groups"])


def _set(**fields: Any) -> Callable[[Body], Body]:
    def change(body: Body) -> Body:
        return {**body, **fields}

    return change


def _round_down(body: Body) -> Body:
    return {**body, "global_batch_size": _world(body) - 1, "divisibility": "round_down"}


def _micro_3(body: Body) -> Body:
    return {**body, "global_batch_size": _world(body) * 8 + 1, "micro_batch_size": 3}


def _last_group(field: str, value: Any) -> Callable[[Body], Body]:
    def change(body: Body) -> Body:
        changed = copy.deepcopy(body)
        changed["topology"]["node_groups"][-1][field] = value
        return changed

    return change


def _misspelt(body: Body) -> Body:
    changed = copy.deepcopy(body)
    last = changed["topology"]["node_groups"][-1]
    last["gpu_per_node"] = last.pop("gpus_per_node")
    return changed


def _no_dataset(body: Body) -> Body:
    return {k: v for k, v in body.items() if k != "dataset"}


# (case, path, change to the feasible body)
CASES: list[tuple[str, str, Callable[[Body], Body]]] = [
    ("feasible plan (baseline)", "/v1/plans", lambda body: body),
    ("round_down, global D-1", "/v1/plans", _round_down),
    ("exact, accumulation 7", "/v1/plans", _set(gradient_accumulation_steps=7)),
    ("exact, micro-batch 3", "/v1/plans", _micro_3),
    ("global batch 5", "/v1/plans", _set(global_batch_size=5)),
    ("tensor 3", "/v1/plans", _set(parallelism={"tensor": 3})),
    ("schema: last group 0 nodes", "/v1/plans", _last_group("num_nodes", 0)),
    ("schema: misspelt field", "/v1/plans", _misspelt),
    ("warmup_epochs without dataset", "/v1/plans", _no_dataset),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"bench_refusals  {GROUPS:,} node groups  {machine_line()}")
    rows: list[list[str]] = []
    proc = None
    try:
        port = free_port()
        env = {"BATCHPLAN_MAX_BODY_BYTES": str(64 << 20)}
        env |= {"BATCHPLAN_LOG_FORMAT": "json", "BATCHPLAN_LOG_LEVEL": "info"}
        proc = start_server(port, None, env)
        wait_ready(port, proc)
        server = (proc, port)
        feasible = node_groups(GROUPS)
        bodies = [
            (name, path, json.dumps(change(feasible), separators=(",", ":")).encode())
            for name, path, change in CASES
        ]
        for _, path, body in bodies:  # one warm-up each
            measure(server, path, body)
        times: dict[str, list[float]] = {name: [] for name, _, _ in bodies}
        statuses: dict[str, int] = {}
        for _ in range(args.repeats):
            for name, path, body in bodies:
                seconds, statuses[name], _size = measure(server, path, body)
                times[name].append(seconds)
        base = statistics.median(times[CASES[0][0]])
        for name, _, _ in bodies:
            med = statistics.median(times[name])
            ok = med <= TARGET * base
            rows.append([name, str(statuses[name]), f"{med * 1e3:,.1f}", f"{med / base:.2f}", verdict(ok)])
    except Exception as err:  # report, never fail the caller
        print(f"ERROR: {type(err).__name__}: {err}")
    finally:
        if proc is not None:
            stop_server(proc)
    print(
        f"\nserver time per request, median of {args.repeats}; ratio to the feasible plan; target <= {TARGET}"
    )
    print(table(["case", "status", "ms", "x plan", f"<= {TARGET}x"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
