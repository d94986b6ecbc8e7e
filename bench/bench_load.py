"""Load benchmark: POST /v1/plans under many concurrent clients while gradient checks run.

Starts ONE real uvicorn server (worker enabled, `--processes` warm rank processes) in its
own session on loopback, waits until the ranks are warm, then measures four phases of
`--seconds` each with `--connections` concurrent keep-alive clients (16 by default):

    livez, plans              with no check running (the comparison)
    livez, plans              while a thread submits gradient checks back to back

and prints requests per second, p50/p99 latency and the error count per phase, plus how
many checks ran (and passed) meanwhile. Goal (issue 6): zero errors, and /v1/plans p99
under 50 ms with 16 clients while checks run.

The load generator is bench_http's (wrk when on PATH, else its asyncio client); nothing is
pinned, since the server, its ranks and the generator share the machine's cores.

    .venv/bin/python bench/bench_load.py                # ~60 s
    .venv/bin/python bench/bench_load.py --seconds 3    # ~30 s

Bounded in time; always exits 0; the server's whole session is killed on every exit path.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, machine_line, table, verdict
from http_load import HOST, Phase, free_port, raw_request, run_asyncio, run_wrk, stop_server, wait_ready

P99_TARGET_MS = 50.0
CHECK_PLAN = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}


def start_server(port: int, processes: int, db: Path) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ,
        BATCHPLAN_WORKER_ENABLED="true",
        BATCHPLAN_PROCESSES_PER_HOST=str(processes),
        BATCHPLAN_JOBS_DB=str(db),
        BATCHPLAN_LOG_LEVEL="warning",
        PYTHONUNBUFFERED="1",
    )
    cmd = [sys.executable, "-m", "uvicorn", "app.main:app", "--host", HOST, "--port", str(port)]
    cmd += ["--workers", "1", "--log-level", "warning", "--no-access-log"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)


def http(port: int, method: str, path: str, body: object | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nConnection: close\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    status, payload = raw_request(port, head.encode() + b"\r\n" + data, timeout=10.0)
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, {}


def wait_warm(port: int, processes: int, limit_s: float = 120.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        status, host = http(port, "GET", "/v1/host")
        if status == 200 and host.get("warm_processes", 0) >= processes:
            return time.monotonic() - started
        time.sleep(0.2)
    raise RuntimeError(f"ranks not warm within {limit_s:.0f} s")


class CheckLoop(threading.Thread):
    """Submits one check at a time and polls it to the end, until stopped."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.halt = threading.Event()
        self.done = self.passed = self.failed = self.refused = 0
        self.durations: list[float] = []

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                status, job = http(self.port, "POST", "/v1/checks", {"plan": CHECK_PLAN})
            except OSError:
                self.failed += 1
                continue
            if status != 202:
                self.refused += 1
                self.halt.wait(0.2)
                continue
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                _, job = http(self.port, "GET", f"/v1/checks/{job['id']}")
                if job.get("status") in ("succeeded", "failed", "cancelled"):
                    break
                self.halt.wait(0.02)
            self.done += 1
            if job.get("status") == "succeeded" and job["result"]["passed"]:
                self.passed += 1
                self.durations.append(job["result"]["timings_s"].get("end_to_end", float("nan")))
            else:
                self.failed += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds per measured phase")
    ap.add_argument("--connections", type=int, default=16, help="concurrent keep-alive clients")
    ap.add_argument("--processes", type=int, default=2, help="warm rank processes (2-4)")
    ap.add_argument("--generator", choices=("auto", "wrk", "asyncio"), default="auto")
    args = ap.parse_args()
    generator = args.generator
    if generator in ("auto", "wrk"):
        generator = "wrk" if shutil.which("wrk") else "asyncio"
    print(f"bench_load  {machine_line()}")
    print(
        f"generator {generator}, {args.connections} concurrent clients, {args.seconds:g} s per phase, "
        f"{args.processes} warm rank processes, checks of {CHECK_PLAN['topology']['gpus_per_node']} replicas"
    )
    proc = None
    rows: list[list[str]] = []
    results: list[tuple[str, Phase]] = []
    loop: CheckLoop | None = None
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        try:
            port = free_port()
            proc = start_server(port, args.processes, Path(tmp) / "jobs.sqlite3")
            wait_ready(port, proc, limit_s=60)
            warm_s = wait_warm(port, args.processes)
            print(f"uvicorn pid {proc.pid} on {HOST}:{port}; ranks warm in {warm_s:.1f} s")

            def drive(endpoint: str, secs: float) -> Phase:
                if generator == "wrk":
                    return run_wrk(endpoint, port, args.connections, secs, None, Path(tmp))
                return run_asyncio(endpoint, port, args.connections, secs)

            drive("livez", 1.0)
            drive("plans", 1.0)
            for label in ("no checks", "checks running"):
                if label == "checks running":
                    loop = CheckLoop(port)
                    loop.start()
                    time.sleep(1.0)  # let the first check start
                for endpoint in ("livez", "plans"):
                    results.append((label, drive(endpoint, args.seconds)))
            if loop is not None:
                loop.halt.set()
                loop.join(timeout=70)
        finally:
            if loop is not None:
                loop.halt.set()
            stop_server(proc)
    for label, phase in results:
        path = "GET /livez" if phase.endpoint == "livez" else "POST /v1/plans"
        rows.append(
            [
                label,
                path,
                f"{phase.rps:8.0f}",
                f"{phase.p50_ms:7.2f}",
                f"{phase.p99_ms:7.2f}",
                str(phase.errors),
            ]
        )
    print()
    print(table(["load", "endpoint", "req/s", "p50 ms", "p99 ms", "errors"], rows))
    if loop is not None:
        mean = sum(loop.durations) / len(loop.durations) if loop.durations else float("nan")
        print(
            f"\nchecks meanwhile: {loop.done} finished, {loop.passed} passed, {loop.failed} failed, "
            f"{loop.refused} refused; mean end-to-end {mean * 1e3:.0f} ms"
        )
    plans = [p for label, p in results if label == "checks running" and p.endpoint == "plans"]
    if plans:
        p = plans[0]
        errors = sum(ph.errors for _, ph in results)
        print(f"target: zero errors ........................ {verdict(errors == 0)} ({errors})")
        print(
            f"target: /v1/plans p99 < {P99_TARGET_MS:g} ms with checks running .. "
            f"{verdict(p.p99_ms < P99_TARGET_MS)} ({p.p99_ms:.2f} ms)"
        )
        if loop is not None:
            ok = loop.passed > 0 and loop.failed == 0
            print(f"target: checks ran and passed .............. {verdict(ok)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
