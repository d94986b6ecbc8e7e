"""The check runner: a bounded queue of jobs in SQLite, run on the warm rank pool.

Everything blocking happens in rank processes or worker threads; the event loop only
passes messages, so /v1/plans stays fast while a check runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.models import PlanRequest
from app.core.planner import plan
from app.worker.pool import RankDied, RankError, RankPool
from app.worker.spec import CheckSpec, SpecError, spec_from_plan
from app.worker.store import CANCELLED, FAILED, FINISHED, SUCCEEDED, JobStore

log = logging.getLogger("batchplan.worker")


class QueueFull(Exception):
    def __init__(self, capacity: int, retry_after: int) -> None:
        super().__init__(f"{capacity} checks are already waiting; retry in about {retry_after} s")
        self.retry_after = retry_after


class AlreadyFinished(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Limits:
    max_replicas_per_check: int
    processes_per_host: int
    queue_size: int
    check_timeout_s: float
    concurrent_checks: int


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class CheckService:
    def __init__(self, jobs_db: Path, limits: Limits) -> None:
        self.limits = limits
        self.store = JobStore(jobs_db)
        self.pool = RankPool(limits.processes_per_host)
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._submitted: dict[str, float] = {}
        self._runners: list[asyncio.Task[None]] = []
        self._stopping = False
        self._mean_check_s = 1.0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        waiting = await asyncio.to_thread(self.store.recover)
        for job_id in waiting:
            if len(self._queued) < self.limits.queue_size:
                self._enqueue(job_id)
            else:
                await asyncio.to_thread(
                    self.store.finish, job_id, FAILED, error="the queue was full when the server restarted"
                )
        self.pool.start()
        self._runners = [asyncio.create_task(self._runner()) for _ in range(self.limits.concurrent_checks)]

    async def stop(self) -> None:
        self._stopping = True
        for runner in self._runners:
            runner.cancel()
        running = list(self._running.values())
        for task in running:
            task.cancel()
        await asyncio.gather(*self._runners, *running, return_exceptions=True)
        await self.pool.stop()
        await asyncio.to_thread(self.store.close)

    # ------------------------------------------------------------------ requests

    def prepare(
        self,
        request: PlanRequest,
        *,
        dtype: str,
        seed: int,
        backend: str,
        timeout_s: float | None,
        nnodes: int,
    ) -> tuple[CheckSpec, float]:
        """Plan the request and check it against this host's limits (blocking: run in a thread)."""
        spec = spec_from_plan(plan(request), dtype=dtype, seed=seed, backend=backend, dataset=request.dataset)
        if spec.data_parallel_size > self.limits.max_replicas_per_check:
            raise SpecError(
                f"the plan has {spec.data_parallel_size} data-parallel replicas; this worker "
                f"checks at most {self.limits.max_replicas_per_check}",
                "/plan/topology",
            )
        if nnodes > spec.data_parallel_size:
            raise SpecError(
                f"{nnodes} nodes for {spec.data_parallel_size} replicas: every node needs one",
                "/rendezvous/nnodes",
            )
        gpus = self.pool.host_info.get("gpus")
        if backend == "nccl" and gpus == 0:
            raise SpecError("backend nccl needs GPUs; this host has none (use gloo or auto)", "/backend")
        timeout = self.limits.check_timeout_s if timeout_s is None else timeout_s
        if timeout > self.limits.check_timeout_s:
            raise SpecError(
                f"timeout_s is at most {self.limits.check_timeout_s:g} on this worker", "/timeout_s"
            )
        return spec, timeout

    async def submit(
        self, body: dict[str, Any], spec: CheckSpec, timeout_s: float, rendezvous: dict[str, Any] | None
    ) -> dict[str, Any]:
        if len(self._queued) >= self.limits.queue_size:
            busy = len(self._queued) + len(self._running)
            wait = math.ceil(self._mean_check_s * busy / self.limits.concurrent_checks)
            raise QueueFull(self.limits.queue_size, max(1, wait))
        job_id = uuid.uuid4().hex
        payload = {"body": body, "spec": spec.to_json(), "timeout_s": timeout_s, "rendezvous": rendezvous}
        job = await asyncio.to_thread(self.store.create, job_id, payload)
        self._submitted[job_id] = time.monotonic()
        self._enqueue(job_id)
        return job

    def _enqueue(self, job_id: str) -> None:
        self._queued.add(job_id)
        self._queue.put_nowait(job_id)

    async def get(self, job_id: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(self.store.get, job_id)

    async def list(self, limit: int, status: str | None) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.store.recent, limit, status)

    async def cancel(self, job_id: str) -> dict[str, Any] | None:
        job = await self.get(job_id)
        if job is None:
            return None
        if job["status"] in FINISHED:
            raise AlreadyFinished(f"check {job_id} already {job['status']}")
        if job_id in self._queued:
            self._queued.discard(job_id)
            await asyncio.to_thread(self.store.finish, job_id, CANCELLED, error="cancelled before it started")
        task = self._running.get(job_id)
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
        return await self.get(job_id)

    def host(self) -> dict[str, Any]:
        info = self.pool.host_info
        warm = len(self.pool.warm())
        return {
            "worker_enabled": True,
            "ready": warm >= self.pool.size,
            "processes_per_host": self.pool.size,
            "warm_processes": warm,
            "busy_processes": sum(1 for p in self.pool.warm() if p.busy),
            "processes": self.pool.describe(),
            "gpus": info.get("gpus"),
            "gpu_names": info.get("gpu_names", []),
            "cuda_available": info.get("cuda_available"),
            "backends": info.get("backends", []),
            "torch_version": info.get("torch_version"),
            "spawn_error": self.pool.spawn_error,
            "queued": len(self._queued),
            "running": len(self._running),
            "queue_size": self.limits.queue_size,
            "concurrent_checks": self.limits.concurrent_checks,
            "max_replicas_per_check": self.limits.max_replicas_per_check,
            "check_timeout_s": self.limits.check_timeout_s,
        }

    # ------------------------------------------------------------------ running

    async def _runner(self) -> None:
        while True:
            job_id = await self._queue.get()
            if job_id not in self._queued:
                continue  # cancelled while waiting
            self._queued.discard(job_id)
            if not await asyncio.to_thread(self.store.start, job_id):
                continue
            task = asyncio.create_task(self._execute(job_id))
            self._running[job_id] = task
            try:
                await asyncio.wait({task})
            finally:
                self._running.pop(job_id, None)

    async def _execute(self, job_id: str) -> None:
        started = time.monotonic()
        timeout = self.limits.check_timeout_s
        status, result, error = FAILED, None, None
        try:
            job = await self.get(job_id)
            assert job is not None
            payload = job["request"]
            timeout = float(payload["timeout_s"])
            result = await asyncio.wait_for(self._run(job_id, payload), timeout)
            status = SUCCEEDED
            submitted = self._submitted.pop(job_id, None)
            timings = result.setdefault("timings_s", {})
            timings["check"] = round(time.monotonic() - started, 6)
            if submitted is not None:
                timings["queued"] = round(started - submitted, 6)
                timings["end_to_end"] = round(time.monotonic() - submitted, 6)
            self._mean_check_s = 0.8 * self._mean_check_s + 0.2 * (time.monotonic() - started)
        except TimeoutError:
            error = (
                f"the check did not finish within timeout_s={timeout:g}; its ranks were killed and replaced"
            )
        except asyncio.CancelledError:
            if self._stopping:
                error = "the server stopped while this check was running; submit it again"
            else:
                status, error = CANCELLED, "cancelled while running; its ranks were killed and replaced"
        except (RankDied, RankError) as err:
            error = f"{err}; the check's ranks were killed and replaced"
        except Exception as err:
            log.exception("check %s failed", job_id)
            error = f"internal error: {type(err).__name__}: {err}"
        finally:
            self._submitted.pop(job_id, None)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.store.finish, job_id, status, result=result, error=error)

    async def _run(self, job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        spec = CheckSpec.from_json(payload["spec"])
        rendezvous = payload.get("rendezvous") or {}
        nnodes = int(rendezvous.get("nnodes", 1))
        dp = spec.data_parallel_size
        wanted = min(dp, self.pool.size)
        ranks = await self.pool.acquire(wanted)
        gpus = int(self.pool.host_info.get("gpus") or 0)
        backend = "gloo"
        if spec.backend == "nccl" or (spec.backend == "auto" and gpus >= wanted):
            backend = "nccl"
        local = ranks[: min(len(ranks), gpus)] if backend == "nccl" else ranks
        healthy = False
        try:
            endpoint = rendezvous.get("endpoint") or f"127.0.0.1:{free_port()}"
            run_id = rendezvous.get("run_id") or job_id
            common = {
                "endpoint": endpoint,
                "run_id": run_id,
                "nnodes": nnodes,
                "timeout_s": payload["timeout_s"],
            }
            joined = await local[0].request({"op": "join", **common, "offered": len(local), "replicas": dp})
            count = int(joined["local_count"])
            message = {
                "op": "run",
                **common,
                "spec": payload["spec"],
                "world": joined["world"],
                "backend": backend,
                "local_processes": count,
            }
            try:
                async with asyncio.TaskGroup() as group:
                    replies = [
                        group.create_task(
                            rank.request(
                                {
                                    **message,
                                    "rank": joined["offset"] + i,
                                    "local_index": i if i < count else -1,
                                    "leader": i == 0,
                                }
                            )
                        )
                        for i, rank in enumerate(local[: max(count, 1)])
                    ]
            except ExceptionGroup as failures:
                raise failures.exceptions[0] from None
            healthy = True
            result: dict[str, Any] = replies[0].result()["result"]
            result["node_rank"] = joined["node_rank"]
            return result
        finally:
            self.pool.release(ranks, healthy)
