"""HTTP benchmark: one uvicorn worker on loopback, GET /livez against POST /v1/plans.

Target (issue 26): POST /v1/plans serves >= 80% of the requests per second of GET /livez,
the server's own floor (same process, same middleware, same load generator), for the README's
plan body and for a mixed-cluster body. Both plan endpoints send varied bodies
(bench/plan_bodies.py), so no response cache could count.

It starts ONE uvicorn worker as a subprocess (BATCHPLAN_WORKER_ENABLED=false, so no
GPU-check ranks start), waits for /livez, checks that every body plans with a 200, warms the
endpoints, then runs `--rounds` rounds; each round drives livez, plans and mixed for
`--seconds` each with a fixed number of keep-alive connections, in an order that reverses
every round (drift from noisy neighbours falls on both sides). Each round gives a ratio
against that round's livez; the figures are the medians over rounds.

Load generator: `wrk` when it is on PATH, else bench/http_load.py's asyncio client
(`--generator asyncio` forces it). On a machine with >= 2 CPUs the server is pinned to CPU 0
and the generator to CPU 1 (`--no-pin` to disable).

    .venv/bin/python bench/bench_http.py             # full: 7 rounds x 3 x 3 s, ~75 s
    .venv/bin/python bench/bench_http.py --quick     # smoke: 2 rounds x 3 x 1 s, ~15 s

Always exits 0; prints PASS/MISS. The server subprocess is killed on every exit path.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_line, table, verdict
from http_load import (
    HOST,
    Phase,
    build_requests,
    free_port,
    raw_request,
    run_phase,
    start_server,
    stop_server,
    wait_ready,
)
from plan_bodies import DESCRIPTIONS, KINDS

TARGET_RATIO = 0.80
ENDPOINTS = ("livez", *KINDS)


def check_bodies(port: int) -> bool:
    """Every body each endpoint will send answers 200 (and once, so the server is warm)."""
    ok = True
    for endpoint in ENDPOINTS:
        statuses, sizes = [], []
        for request in build_requests(endpoint, port, close=True):
            status, body = raw_request(port, request)
            statuses.append(status)
            sizes.append(len(body))
        bad = sum(s != 200 for s in statuses)
        ok = ok and bad == 0
        extra = f", e.g. {json.loads(body).get('global_batch_size')} global" if endpoint != "livez" else ""
        print(
            f"check: {endpoint:5} {len(statuses)} distinct requests, {bad} not 200, "
            f"answers {min(sizes)}-{max(sizes)} bytes{extra}"
        )
    return ok


def summarise(phases: list[Phase], rounds: int) -> dict[str, list[float]]:
    """Per endpoint, each round's req/s ratio and server-CPU ratio against livez."""
    ratios: dict[str, list[float]] = {}
    for r in range(rounds):
        by = {p.endpoint: p for p in phases[r * len(ENDPOINTS) : (r + 1) * len(ENDPOINTS)]}
        for endpoint in KINDS:
            ratios.setdefault(endpoint, []).append(by[endpoint].rps / by["livez"].rps)
            ratios.setdefault(endpoint + " cpu", []).append(
                by["livez"].cpu_us_per_request / by[endpoint].cpu_us_per_request
            )
    return ratios


# One scenario after another, each printed as it ends: a script to read top to bottom.
def main() -> int:  # noqa: PLR0915
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run, ~15 s")
    ap.add_argument("--seconds", type=float, help="seconds per measured phase (default 3, quick 1)")
    ap.add_argument("--rounds", type=int, help="rounds of livez, plans, mixed (default 7, quick 2)")
    ap.add_argument("--connections", type=int, default=8, help="concurrent keep-alive connections")
    ap.add_argument("--generator", choices=("auto", "wrk", "asyncio"), default="auto")
    ap.add_argument("--no-pin", action="store_true", help="do not pin server and generator to CPUs")
    args = ap.parse_args()
    seconds = args.seconds or (1.0 if args.quick else 3.0)
    rounds = args.rounds or (2 if args.quick else 7)
    warm_s = 1.0 if args.quick else 2.0
    generator = args.generator
    if generator == "auto":
        generator = "wrk" if shutil.which("wrk") else "asyncio"
    elif generator == "wrk" and not shutil.which("wrk"):
        print("wrk not on PATH; using the asyncio generator")
        generator = "asyncio"
    pin = not args.no_pin and (os.cpu_count() or 1) >= 2 and hasattr(os, "sched_setaffinity")
    server_cpu, client_cpu = (0, 1) if pin else (None, None)

    print(f"bench_http  ({'quick' if args.quick else 'full'})  {machine_line()}")
    print(
        f"generator {generator}, {args.connections} keep-alive connections, {rounds} rounds x "
        f"{seconds:g} s per endpoint, pinning {'server->CPU0, generator->CPU1' if pin else 'off'}"
    )
    for kind in KINDS:
        print(f"  {kind}: POST /v1/plans, 64 varied bodies: {DESCRIPTIONS[kind]}")

    if pin and generator == "asyncio":
        os.sched_setaffinity(0, {client_cpu})
    proc = None
    phases: list[Phase] = []
    bodies_ok = False
    try:
        port = free_port()
        t0 = time.perf_counter()
        proc = start_server(port, server_cpu)
        wait_ready(port, proc)
        print(f"uvicorn pid {proc.pid} on {HOST}:{port}, ready in {time.perf_counter() - t0:.1f} s")
        bodies_ok = check_bodies(port)

        with tempfile.TemporaryDirectory() as tmp:

            def drive(endpoint: str, secs: float) -> Phase:
                return run_phase(
                    generator, endpoint, port, args.connections, secs, proc.pid, client_cpu, Path(tmp)
                )

            for endpoint in ENDPOINTS:
                drive(endpoint, warm_s)
            for r in range(rounds):
                order = ENDPOINTS if r % 2 == 0 else tuple(reversed(ENDPOINTS))
                measured = {e: drive(e, seconds) for e in order}
                phases.extend(measured[e] for e in ENDPOINTS)  # stored in one order
                if proc.poll() is not None:
                    raise RuntimeError(f"uvicorn exited with {proc.returncode} during the run")
    except KeyboardInterrupt:
        print("interrupted")
    except Exception as err:  # report, never fail the caller
        print(f"ERROR: {type(err).__name__}: {err}")
    finally:
        stop_server(proc)

    rounds_done = len(phases) // len(ENDPOINTS)
    if rounds_done == 0:
        print("\nincomplete run; no verdict\nPLANS/LIVEZ: MISS (not measured)")
        return 0

    rows = [
        [
            f"{i // len(ENDPOINTS) + 1}",
            p.endpoint,
            f"{p.requests:,}",
            f"{p.rps:,.0f}",
            f"{p.p50_ms:.2f}",
            f"{p.p99_ms:.2f}",
            f"{p.errors}",
            f"{p.cpu_us_per_request:,.0f}",
        ]
        for i, p in enumerate(phases[: rounds_done * len(ENDPOINTS)])
    ]
    print("\nphases (each round's order alternates; listed in one order)")
    print(table(["round", "endpoint", "requests", "req/s", "p50 ms", "p99 ms", "errors", "CPU us/req"], rows))

    ratios = summarise(phases, rounds_done)
    med = statistics.median
    summary_rows = []
    for endpoint in ENDPOINTS:
        ps = [p for p in phases if p.endpoint == endpoint]
        ratio = f"{med(ratios[endpoint]):.2f}" if endpoint in ratios else "1"
        cpu_ratio = f"{med(ratios[endpoint + ' cpu']):.2f}" if endpoint in ratios else "1"
        summary_rows.append(
            [
                endpoint,
                f"{med(p.rps for p in ps):,.0f}",
                ratio,
                f"{min(ratios.get(endpoint, [1])):.2f}-{max(ratios.get(endpoint, [1])):.2f}",
                f"{med(p.p50_ms for p in ps):.2f}",
                f"{med(p.p99_ms for p in ps):.2f}",
                f"{sum(p.errors for p in ps)}",
                f"{med(p.cpu_us_per_request for p in ps):,.0f}",
                cpu_ratio,
            ]
        )
    print(f"\nsummary: medians over {rounds_done} rounds; ratios against the same round's livez")
    headers = ["endpoint", "req/s", "x livez", "range", "p50 ms", "p99 ms", "errors", "CPU us/req"]
    print(table([*headers, "x livez by CPU"], summary_rows))
    livez = [p.rps for p in phases if p.endpoint == "livez"]
    drift = (max(livez) - min(livez)) / max(livez)
    print(f"\nlivez spread across rounds {drift:.0%} (above ~15%: the machine was busy; rerun)")
    errors = sum(p.errors for p in phases)
    for endpoint in KINDS:
        ratio = med(ratios[endpoint])
        print(
            f"{endpoint.upper()}/LIVEZ >= {TARGET_RATIO:.2f}: {verdict(ratio >= TARGET_RATIO)} ({ratio:.2f})"
        )
    print(f"NO ERRORS: {verdict(errors == 0 and bodies_ok)} ({errors})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
