"""Checks of many replicas over HTTP on warm ranks: the 4,096-replica check and a 100,000-replica
mixed cluster, with the base revision's server beside this one.

    .venv/bin/python bench/bench_replicas.py [--runs 3] [--processes 2] [--base /tmp/base9c]

Starts `uvicorn app.main:app` with `--processes` warm gloo ranks (2: as `batchplan check
--processes 2`), runs each case once (discarded: the ranks' first use), then `--runs` times, and
prints each case's median time from submit to result and the ranks' own time (`rank_total`).
Cases: `ddp4096` (`--gpus-per-node 4096 -b 8192 -m 2`) and `mixed100k` (three node groups,
micro-batches 2-4, a padded shuffled dataset of 1,000,003 samples). With `--base`, the same
under that tree's server (a worktree of the revision, run with this venv), case by case, and
the ratio (base / this: the speed-up), for ddp4096 only (the base would take many minutes over
mixed100k: a sampler and a backward per replica).
Targets: mixed100k at most 10 s from submit to result; ddp4096 at least 3x faster than 9c82496.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT
from profile_checks import CASES

from app.ports import free_port
from tests.support.polling import run_check
from tests.support.servers import QUIET, Server, running, server_argv, wait_until_live

NAMES = ("ddp4096", "mixed100k")


def _cases(
    tree: Path, processes: int, runs: int, names: tuple[str, ...]
) -> dict[str, tuple[float, float] | str]:
    """Each case's median (submit to result, rank_total) under `tree`'s server, or why not."""
    port = free_port()
    env = {
        **os.environ,
        **QUIET,
        "PYTHONPATH": str(tree),
        "BATCHPLAN_PROCESSES_PER_HOST": str(processes),
        "BATCHPLAN_MAX_REPLICAS_PER_CHECK": "131072",
        "BATCHPLAN_CHECK_TIMEOUT_S": "600",
        "CUDA_VISIBLE_DEVICES": "",
    }
    out: dict[str, tuple[float, float] | str] = {}
    with running(server_argv(port), env, tree, None) as proc:
        wait_until_live(proc, port, None, 120)
        server = Server(proc, port, None)
        server.wait_warm(processes, timeout=180)
        for name in names:
            body = CASES[name][1]
            walls, ranks = [], []
            for run in range(runs + 1):
                started = time.perf_counter()
                job = run_check(server.client, body, timeout=900)
                wall = time.perf_counter() - started
                if job["status"] != "succeeded" or not job["result"]["passed"]:
                    out[name] = f"{job['status']}: {str(job.get('error') or job.get('result'))[:200]}"
                    break
                if run:
                    walls.append(wall)
                    ranks.append(job["result"]["timings_s"]["rank_total"])
            else:
                out[name] = (statistics.median(walls), statistics.median(ranks))
        server.client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--base", type=Path, help="a worktree of the revision to compare with")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}, {os.cpu_count()} cores")
    this = _cases(ROOT, args.processes, args.runs, NAMES)
    # Not mixed100k on the base: a sampler and a backward per replica would take many minutes.
    base = _cases(args.base.resolve(), args.processes, args.runs, ("ddp4096",)) if args.base else {}
    for name in NAMES:
        found = this[name]
        line = f"{name}: " + (
            f"submit to result {found[0]:.3f} s, ranks {found[1]:.3f} s"
            if isinstance(found, tuple)
            else found
        )
        if name == "mixed100k" and isinstance(found, tuple):
            line += f" [{'PASS' if found[0] <= 10 else 'MISS'}: <= 10 s]"
        if args.base:
            old = base.get(name, "not run (a sampler and a backward per replica: many minutes)")
            if isinstance(old, tuple) and isinstance(found, tuple):
                line += (
                    f"; base {old[0]:.3f} s (ranks {old[1]:.3f} s): {old[0] / found[0]:.1f}x faster "
                    f"(ranks {old[1] / found[1]:.1f}x)"
                )
                if name == "ddp4096":
                    line += f" [{'PASS' if old[0] / found[0] >= 3 else 'MISS'}: >= 3x]"
            else:
                line += f"; base: {old}"
        print(line)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
