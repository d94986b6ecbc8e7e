"""What a client's way of waiting costs a check: the mesh checks of bench_checks.py, warm, over
HTTP, each timed three ways in turn on one server (8 warm rank processes):

- `wait`: GET ?wait=30, answered once the check finishes (what bench_checks.py does);
- `hold`: GET with no parameter every 2 ms after each answer, which the server holds up to
  25 ms while the check has not finished (api/checks.HOLD_S);
- `poll`: GET ?wait=0 every 2 ms, answered at once (every GET before the hold).

    .venv/bin/python bench/bench_polling.py [--rounds 2] [--runs 9]

Prints each round's medians and, over all rounds, each way's median and its ratio to `wait`.
On a small machine a client that polls competes with the ranks for CPU; the ratios say how
much of a check's time that costs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from _common import machine_line
from bench_checks import MESHES, check_over_http, mesh_plan

from tests.support.servers import serve

WAYS: dict[str, float | None] = {"wait": 30.0, "hold": None, "poll": 0.0}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    print(f"bench_polling  {machine_line()}  {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {"BATCHPLAN_JOBS_DB": str(Path(tmp) / "jobs.sqlite3"), "BATCHPLAN_PROCESSES_PER_HOST": "8"}
        with serve(env, limit_s=120) as server:
            client = server.client
            client.timeout = httpx.Timeout(60)
            server.wait_warm(8, timeout=600)
            for round_ in range(1, args.rounds + 1):
                for name, parallelism in MESHES.items():
                    body = {"plan": mesh_plan(parallelism)}
                    for way, wait in WAYS.items():
                        check_over_http(client, body, wait=wait)  # not counted
                        runs = [check_over_http(client, body, wait=wait)[0] for _ in range(args.runs)]
                        times.setdefault((name, way), []).extend(runs)
                        print(f"round {round_}: {name} {way} median {statistics.median(runs):.4f} s")
    print(f"\nover {args.rounds} rounds of {args.runs}: median s (x wait)")
    print("| mesh | wait | hold | poll |")
    print("|---|---:|---:|---:|")
    for name in MESHES:
        medians = [statistics.median(times[(name, w)]) for w in WAYS]
        cells = [f"{m:.4f} ({m / medians[0]:.2f})" for m in medians]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
