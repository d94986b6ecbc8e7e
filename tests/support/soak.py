"""A soak: a real uvicorn with warm ranks runs a seeded mix of checks (soak_mix) while a chaos
loop SIGKILLs ranks and the fork server, stops the server with SIGTERM or SIGKILL and restarts
it on the same job database, and floods the queue past its limit. It records what a judge
needs: every submission and its answer, each fault and how long the pool took to be warm
again, /readyz against itself, zombies, leftovers and the server's memory and open files.

tests/reliability/test_soak.py runs a short one and holds the properties; bench/bench_soak.py
runs a long one and prints the figures. Each soak has its own ports, folder and database.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from .polling import NOT_ANSWERING, hold_ranks, run_check, wait_for
from .processes import children, fork_server, rss_and_fds, session_processes, zombies
from .servers import Server, serve, worker_env
from .soak_mix import EVEN_2, FINISHED, KINDS, MODELS, body, judge, pick
from .soak_plan import Lifetime, Report, SoakPlan


class Soak:
    def __init__(self, plan: SoakPlan, folder: Path) -> None:
        self.plan = plan
        self.folder = folder
        self.report = Report()
        self.rng = random.Random(plan.seed)
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.server: Server | None = None
        self._stack = contextlib.ExitStack()
        self._lifetime: Lifetime | None = None
        self._born = 0.0
        self.reruns: dict[str, dict[str, Any]] = {}
        self._readyz: list[tuple[float, int]] = []  # (when, status code) of each /readyz
        self._gone: set[int] = set()  # the ranks a fault killed, until they are replaced

    # ----------------------------------------------------------------- servers

    def _start(self) -> None:
        index = len(self.report.lifetimes)
        env = worker_env(
            self.folder / "jobs.sqlite3",
            self.plan.processes,
            queue_size=str(self.plan.queue_size),
            check_models=MODELS,
        )
        server = self._stack.enter_context(serve(env, self.folder / f"server-{index}.log", limit_s=60))
        self._lifetime = Lifetime(server.process.pid)
        self.report.lifetimes.append(self._lifetime)
        self._born = time.monotonic()
        with self.lock:
            self.server = server

    def _warm(self) -> bool:
        server = self.server
        assert server is not None
        host = httpx.get(f"{server.url}/v1/host", timeout=5).json()
        loaded = all(m["loaded"] is not None for m in host["models"])
        replaced = not self._gone & {p["pid"] for p in host["processes"]}
        return bool(host["warm_processes"] >= self.plan.processes and loaded and replaced)

    def _wait_warm(self) -> None:
        assert self.server is not None and self._lifetime is not None
        limit = self.plan.recovery_limit_s
        wait_for(self._warm, "a warm pool", limit, self.server.log, proc=self.server.process)

    def _measure(self, which: str) -> None:
        lifetime = self._lifetime
        if lifetime is not None:
            with contextlib.suppress(OSError, StopIteration):
                setattr(lifetime, which, rss_and_fds(lifetime.pid))

    def _end(self, sig: signal.Signals) -> None:
        """Stop the server with `sig`; what of its session is still alive 20 s later leaked."""
        server, lifetime = self.server, self._lifetime
        assert server is not None and lifetime is not None
        self._measure("end")
        with self.lock:
            self.server = None
        os.kill(server.process.pid, sig)
        server.process.wait(timeout=60)
        lifetime.seconds = time.monotonic() - self._born
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not session_processes(lifetime.pid), "its session to end", 20, interval=0.1)
        lifetime.leaked = [p.command[:120] for p in session_processes(lifetime.pid)]
        self._stack.close()  # ends whatever leaked, so that the next server starts clean
        self._stack = contextlib.ExitStack()

    # ----------------------------------------------------------------- faults

    def _inject(self, fault: str) -> None:
        server = self.server
        assert server is not None
        started = time.monotonic()
        if fault in ("sigterm", "sigkill"):
            self._end(signal.SIGTERM if fault == "sigterm" else signal.SIGKILL)
            self._start()
            self._wait_warm()
            assert self._lifetime is not None
            self._lifetime.warm_s = time.monotonic() - self._born
        elif fault == "flood":
            # A check that holds the ranks keeps the queue from draining meanwhile.
            holder = hold_ranks(server.client, EVEN_2, timeout=self.plan.recovery_limit_s, timeout_s=60)
            self.report.ledger.accepted[holder.rsplit("/", 1)[1]] = "holder"
            kinds = [pick(self.rng) for _ in range(self.plan.queue_size + 4)]
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(lambda kind: _post(server.url, kind), kinds))
            for kind, (status, payload) in zip(kinds, answers, strict=True):
                self.report.ledger.answered(kind, status, payload)
            self.report.flood_refusals.append(sum(status == 429 for status, _ in answers))
            server.client.delete(holder)
            self.report.faults[fault] += 1
            return
        else:
            parent = fork_server(server.process.pid)
            ranks = children(parent) if parent is not None else []
            if not ranks:
                return
            victim = self.rng.choice(ranks) if fault == "rank" else parent
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
            # Warm again means without them: every rank killed (with the fork server: all) replaced.
            self._gone = set(ranks) if fault == "fork_server" else {victim}
        self.report.faults[fault] += 1
        self._wait_warm()
        self._gone = set()
        self.report.recovery_s.setdefault(fault, []).append(time.monotonic() - started)
        if fault == "fork_server" and not self._readyz_said_no(started):
            self.report.readyz_missed.append(f"ready throughout the fork server's restart at {started:.1f}")

    # ----------------------------------------------------------------- threads

    def _submit(self) -> None:
        rng = random.Random(self.plan.seed + 1)
        with httpx.Client(timeout=10) as client:
            while not self.done.is_set():
                server = self.server
                try:
                    if server is None:
                        raise httpx.ConnectError("restarting")
                    if client.get(f"{server.url}/v1/host").json()["queued"] >= self.plan.backlog:
                        time.sleep(0.02)
                        continue
                    kind = pick(rng)
                    self.report.ledger.answered(kind, *_post(server.url, kind, client))
                    accepted = list(self.report.ledger.accepted)[-8:]
                    if accepted and rng.random() < 0.08:
                        response = client.delete(f"{server.url}/v1/checks/{rng.choice(accepted)}")
                        self.report.ledger.cancels[response.status_code] += 1
                        if response.status_code not in (200, 409, 503):
                            self.report.ledger.unexpected.append(f"DELETE: {response.status_code}")
                except (*NOT_ANSWERING, ValueError):
                    time.sleep(0.1)

    def _watch(self) -> None:
        """/readyz every 0.1 s, held to itself; the server's zombies every second."""
        seen: set[int] = set()
        last_zombie_scan = 0.0
        with httpx.Client(timeout=5) as client:
            while not self.done.is_set():
                server = self.server
                with contextlib.suppress(*NOT_ANSWERING, ValueError):
                    if server is not None:
                        response = client.get(f"{server.url}/readyz")
                        self._readyz.append((time.monotonic(), response.status_code))
                        self._judge_readyz(response.status_code, response.json())
                        if time.monotonic() - last_zombie_scan > 1.0:
                            last_zombie_scan = time.monotonic()
                            now = set(zombies(server.process.pid))
                            self.report.zombies += [f"pid {pid} unreaped for over 1 s" for pid in now & seen]
                            seen = now
                time.sleep(0.1)

    def _judge_readyz(self, code: int, ready: dict[str, Any]) -> None:
        worker = ready["worker"]
        self.report.readyz_samples[f"{code} {ready['status']}"] += 1
        warm = worker.get("ready") is True
        lies = (ready["status"] == "ready") != warm or (code == 200) != warm
        if warm and worker["warm_processes"] != worker["processes_per_host"]:
            lies = True
        if lies:
            self.report.readyz_lies.append(f"{code} {ready}")

    def _readyz_said_no(self, since: float) -> bool:
        return any(t >= since and code == 503 for t, code in list(self._readyz))

    # ----------------------------------------------------------------- the run

    def run(self) -> Report:
        started = time.monotonic()
        threads = [threading.Thread(target=f, daemon=True) for f in (self._watch, self._submit)]
        try:
            self._start()
            self._wait_warm()
            self._measure("start")
            assert self._lifetime is not None
            self._lifetime.warm_s = time.monotonic() - self._born
            assert self.server is not None
            # The oracle: each kind once on the pristine pool, before any fault.
            self.reruns = {k: run_check(self.server.client, body(k), 120) for k in KINDS}
            self.reruns = {k: job["result"] for k, job in self.reruns.items() if job["status"] == "succeeded"}
            for thread in threads:
                thread.start()
            for fault in self.plan.faults:
                time.sleep(self.rng.uniform(*self.plan.gap_s))
                self._inject(fault)
                if fault in ("sigterm", "sigkill"):
                    self._measure("start")
            time.sleep(self.rng.uniform(*self.plan.gap_s))
            self.done.set()
            for thread in threads:
                thread.join(timeout=30)
            self.report.verdict = judge(self._drain(), self.report.ledger, self.reruns)
            self._end(signal.SIGTERM)
        finally:
            self.done.set()
            self._stack.close()
            self.report.wall_s = time.monotonic() - started
        return self.report

    def _drain(self) -> dict[str, dict[str, Any] | None]:
        """Every accepted job once none is queued or running (or the limit passed)."""
        server = self.server
        assert server is not None
        jobs: dict[str, dict[str, Any] | None] = {}
        deadline = time.monotonic() + self.plan.recovery_limit_s + 60 * self.plan.queue_size
        pending = list(self.report.ledger.accepted)
        while pending and time.monotonic() < deadline:
            for job_id in pending:
                response = server.client.get(f"/v1/checks/{job_id}")
                jobs[job_id] = response.json() if response.status_code == 200 else None
            pending = [j for j in pending if (job := jobs[j]) is not None and job["status"] not in FINISHED]
            time.sleep(0.2 if pending else 0)
        return jobs


def _post(url: str, kind: str, client: httpx.Client | None = None) -> tuple[int, Any]:
    if client is None:
        response = httpx.post(f"{url}/v1/checks", json=body(kind), timeout=10)
    else:
        response = client.post(f"{url}/v1/checks", json=body(kind))
    return response.status_code, response.json()
