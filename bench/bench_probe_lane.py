"""A one-step check while a long lr-scaling probe trains (the probe's own lane), in-process (a
TestClient over the app with warm gloo ranks).

    .venv/bin/python bench/bench_probe_lane.py [--processes 4] [--checks 10] [--samples 2097152]

(a) The probe (4 replicas, 4 runs, --samples) is sent and, once it holds its ranks, --checks
    one-step checks (2 replicas) one after another: each one's time from POST to its result.
    Target: every one within 1 s (median and max printed), the probe still running.
(b) Admission at the schema's maximum (lr_scaling.samples 16,777,216): refused at once, the
    estimate and the suggested samples printed. Target: a 422 within 1 s.
Prints figures, the load (os.getloadavg) and PASS/MISS; always exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, machine_line, verdict  # (puts the repository on the path)

sys.path.insert(0, str(ROOT / "tests"))
from support.apps import warm_app
from support.polling import wait_check, wait_for

LR = {"base_lr": 0.01, "base_batch_size": 16, "rule": "linear", "warmup_steps": 2}
PROBE_PLAN = {"topology": {"num_nodes": 1, "gpus_per_node": 4}, "global_batch_size": 64, "learning_rate": LR}
ONE_STEP = {"plan": {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 8}}
SCHEMA_MAX = 1 << 24


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--checks", type=int, default=10)
    parser.add_argument("--samples", type=int, default=1 << 21)
    args = parser.parse_args()
    print(machine_line(), f"load {os.getloadavg()[0]:.1f}")
    with (
        tempfile.TemporaryDirectory() as tmp,
        warm_app(Path(tmp) / "jobs.sqlite3", args.processes, timeout=300, log_level="warning") as client,
    ):
        probe = {"plan": PROBE_PLAN, "lr_scaling": {"samples": args.samples}}
        started = client.post("/v1/checks", json=probe)
        if started.status_code != 202:
            print(f"the probe was refused: {started.text}")
            return
        location = started.headers["location"]
        wait_check(client, location, ("running",), timeout=120)
        wait_for(lambda: client.get("/v1/host").json()["busy_processes"] >= 1, "the probe's ranks")
        times = []
        for _ in range(args.checks):
            sent = time.perf_counter()
            short = client.post("/v1/checks", json=ONE_STEP)
            job = wait_check(client, short.headers["location"], timeout=60)
            times.append(time.perf_counter() - sent)
            assert job["status"] == "succeeded", job
        running = client.get(location).json()["status"] == "running"
        client.delete(location)
        print(
            f"(a) one-step check while a probe of {args.samples:,} samples trains: median "
            f"{statistics.median(times):.3f} s, max {max(times):.3f} s over {len(times)}; probe still "
            f"running: {running}  {verdict(max(times) < 1.0 and running)}"
        )
        sent = time.perf_counter()
        refused = client.post("/v1/checks", json={"plan": PROBE_PLAN, "lr_scaling": {"samples": SCHEMA_MAX}})
        took = time.perf_counter() - sent
        problem = refused.json()
        print(f"(b) samples {SCHEMA_MAX:,}: {refused.status_code} in {took:.3f} s: {problem.get('detail')}")
        ok = refused.status_code == 422 and took < 1.0
        print(f"    suggestions {problem.get('suggestions')}  {verdict(ok)}")
    print(f"load after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
