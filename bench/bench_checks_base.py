"""The warm 8-replica check over HTTP, this tree against another revision, side by side.

    git worktree add /tmp/base REV
    .venv/bin/python bench/bench_checks_base.py --base /tmp/base [--rounds 3] [--runs 7]

Each round starts `uvicorn app.main:app` from each tree in turn (its own directory first on
the path, 8 warm rank processes), waits for the ranks, discards one check and times `--runs`
checks of bench_checks.py's 8-replica plan, POST until the result. It prints each round's
medians and, over all rounds, each tree's median and their ratio (this tree / base): what a
user sees, process-group set-up and teardown included, where bench/profile_checks.py --base
times the ranks alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from _common import ROOT
from bench_checks import check_over_http, plan

from app.ports import free_port
from tests.support.servers import QUIET, Server, running, server_argv, wait_until_live

PROCESSES = 8


def timed_tree(tree: Path, runs: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            **QUIET,
            "BATCHPLAN_JOBS_DB": str(Path(tmp) / "jobs.sqlite3"),
            "BATCHPLAN_PROCESSES_PER_HOST": str(PROCESSES),
        }
        port = free_port()
        with running(server_argv(port), env, tree, None) as proc:
            server = Server(proc, port, None, None)
            try:
                wait_until_live(proc, port, None, 60)
                server.wait_warm(PROCESSES, timeout=600)
                server.client.timeout = httpx.Timeout(60)
                body = {"plan": plan(PROCESSES)}
                # Polled alike, answered at once (?wait=0; older revisions ignore it), so that
                # both pay the same.
                check_over_http(server.client, body, wait=0)
                return [check_over_http(server.client, body, wait=0)[0] for _ in range(runs)]
            finally:
                server.client.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", type=Path, required=True, help="a worktree of the revision to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    trees = {"base": args.base.resolve(), "this": ROOT}
    times: dict[str, list[float]] = {name: [] for name in trees}
    for round_ in range(args.rounds):
        for name, tree in trees.items():
            got = timed_tree(tree, args.runs)
            times[name] += got
            print(f"round {round_ + 1}: {name} ({tree}) median {statistics.median(got):.4f} s", flush=True)
    base, this = statistics.median(times["base"]), statistics.median(times["this"])
    print(
        f"{PROCESSES} replicas over HTTP, medians of {len(times['this'])}: base {base:.4f} s, "
        f"this tree {this:.4f} s, ratio {this / base:.2f} (goal <= 0.5)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
