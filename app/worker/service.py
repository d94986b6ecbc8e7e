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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.errors import Busy, Conflict, NotFound, Unavailable
from app.core.model_registry import SYNTHETIC, unknown_model
from app.core.models import PlanRequest
from app.core.planner import plan
from app.logging_setup import job_id_var
from app.ports import free_port
from app.worker.pool import SHUTDOWN_GRACE_S, RankDied, RankError, RankPool
from app.worker.request import with_options
from app.worker.spec import CheckSpec, SpecError, spec_from_plan
from app.worker.store import CANCELLED, FAILED, FINISHED, INTERRUPTED, SUCCEEDED, JobStore

log = logging.getLogger("batchplan.worker")

# What a check that the shutdown stopped records (status failed).
# Tries to write a finished job (about 30 s in all) before giving up on the database.
FINISH_ATTEMPTS = 9
SHUTTING_DOWN = "server shutting down: " + INTERRUPTED

ModelList = list[dict[str, Any]]  # a name: CheckService has a method called list

# Called with (status, passed or None, seconds the check ran) whenever a check finishes.
FinishObserver = Callable[[str, bool | None, float], None]


def queue_full(capacity: int, retry_after: int) -> Busy:
    return Busy(
        f"{capacity} checks are already waiting; retry in about {retry_after} s", retry_after=retry_after
    )


def shutting_down() -> Unavailable:
    """The server is shutting down: no new checks."""
    return Unavailable(
        "the server is shutting down and takes no new checks; retry on another worker", retry_after=5
    )


def no_such_check(job_id: str) -> NotFound:
    return NotFound(f"no check with id {job_id!r}")


@dataclass(frozen=True, slots=True)
class Limits:
    max_replicas_per_check: int
    processes_per_host: int
    queue_size: int
    check_timeout_s: float
    concurrent_checks: int
    # A rank holds the epoch's index list and the global batch in memory.
    max_check_samples: int = 1 << 20
    # Hosts a rendezvous endpoint may name; empty: this host's own names and loopback.
    rendezvous_hosts: tuple[str, ...] = ()

    def allowed_rendezvous_hosts(self) -> set[str]:
        if self.rendezvous_hosts:
            return {h.lower() for h in self.rendezvous_hosts}
        names = {"127.0.0.1", "::1", "localhost", socket.gethostname().lower(), socket.getfqdn().lower()}
        return names


class CheckService:
    def __init__(self, jobs_db: Path, limits: Limits, models: dict[str, str] | None = None) -> None:
        self.limits = limits
        self.models = dict(models or {})  # registered check models: name -> package.module:factory
        self.store = JobStore(jobs_db)
        self.pool = RankPool(limits.processes_per_host, self.models)
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._running: dict[str, asyncio.Task[None]] = {}
        # Every _execute task until it has recorded its job: stop() waits for these, not for
        # _running, which a runner cancelled by begin_shutdown() empties before that.
        self._executing: set[asyncio.Task[None]] = set()
        self._submitted: dict[str, float] = {}
        self._runners: list[asyncio.Task[None]] = []
        self._stopping = False
        self._stopped = False
        self._mean_check_s = 1.0
        self.observers: list[FinishObserver] = []

    @property
    def shutting_down(self) -> bool:
        return self._stopping

    def queue_depth(self) -> int:
        return len(self._queued)

    def running_count(self) -> int:
        return len(self._running)

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

    def begin_shutdown(self) -> None:
        """The first step of a shutdown, safe to call early (from a SIGTERM) and repeatedly:
        refuse new checks, start no more rank processes, cancel the running checks (each
        records SHUTTING_DOWN). Queued checks stay queued in the database and run after a
        restart. `stop()` then waits for all of it and ends every process."""
        if self._stopping:
            return
        self._stopping = True
        self.pool.stopping = True
        log.info(
            "shutting down: %d running checks cancelled, %d queued kept for the next start",
            len(self._running),
            len(self._queued),
        )
        for runner in self._runners:
            runner.cancel()
        for task in self._running.values():
            task.cancel()

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.begin_shutdown()
        await asyncio.gather(*self._runners, *self._executing, return_exceptions=True)
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
        options: dict[str, Any] | None = None,
    ) -> tuple[CheckSpec, float]:
        """Plan the request and check it against this host's limits (blocking: run in a thread).
        `options`: the model, noise-scale and micro-batch-search fields of the spec."""
        spec = spec_from_plan(plan(request), dtype=dtype, seed=seed, backend=backend, dataset=request.dataset)
        if options:
            spec = with_options(spec, options)
        self._check_model(spec, has_dataset=request.dataset is not None)
        if spec.data_parallel_size > self.limits.max_replicas_per_check:
            raise SpecError(
                f"the plan has {spec.data_parallel_size} data-parallel replicas; this worker "
                f"checks at most {self.limits.max_replicas_per_check}",
                "/plan/topology",
            )
        cap = self.limits.max_check_samples
        if spec.global_batch_size > cap:
            raise SpecError(
                f"a check materialises the global batch: {spec.global_batch_size} samples is more "
                f"than this worker's limit of {cap} (BATCHPLAN_MAX_CHECK_SAMPLES); the plan itself "
                f"has no such limit, so check a smaller global batch with the same split",
                "/plan/global_batch_size",
            )
        if request.dataset is not None and request.dataset.num_samples > cap:
            raise SpecError(
                f"a check builds the epoch's index list: dataset.num_samples {request.dataset.num_samples} "
                f"is more than this worker's limit of {cap} (BATCHPLAN_MAX_CHECK_SAMPLES); leave the "
                f"dataset out to check the first step alone",
                "/plan/dataset/num_samples",
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

    def _check_model(self, spec: CheckSpec, *, has_dataset: bool) -> None:
        if spec.model != SYNTHETIC and spec.model not in self.models:
            raise SpecError(unknown_model(spec.model, list(self.models)), "/model")
        info = self.pool.models_info.get(spec.model)
        if info is not None and not info.get("loaded"):
            raise SpecError(
                f"check model {spec.model!r} cannot be built on this worker: {info['error']}", "/model"
            )
        size = info.get("dataset_size") if info else None
        if isinstance(size, int) and spec.num_samples > size:
            pointer = "/plan/dataset/num_samples" if has_dataset else "/plan/global_batch_size"
            raise SpecError(
                f"check model {spec.model!r} has {size} samples; the check's epoch needs {spec.num_samples} "
                f"(without a dataset it is one global batch): use at most {size}",
                pointer,
            )
        if spec.fit is not None and spec.fit.get("memory_bytes") is None:
            gpus = self.pool.host_info.get("gpus")
            if gpus == 0 or spec.backend == "gloo":
                raise SpecError(
                    "the search for the largest micro-batch runs on this worker's CPU here, whose "
                    "memory torch cannot size: give the memory of one GPU of the cluster, e.g. "
                    "85899345920 for 80 GiB",
                    "/fit_micro_batch/memory_bytes",
                )
        if spec.noise_steps and spec.data_parallel_size == 1 and spec.gradient_accumulation_steps == 1:
            raise SpecError(
                "the noise scale compares a small batch with a big one: it needs at least 2 data-parallel "
                "replicas or 2 accumulation steps; send noise_scale.steps 0 to skip it",
                "/noise_scale/steps",
            )

    async def submit(
        self, body: dict[str, Any], spec: CheckSpec, timeout_s: float, rendezvous: dict[str, Any] | None
    ) -> dict[str, Any]:
        if self._stopping:
            raise shutting_down()
        if len(self._queued) >= self.limits.queue_size:
            busy = len(self._queued) + len(self._running)
            wait = math.ceil(self._mean_check_s * busy / self.limits.concurrent_checks)
            raise queue_full(self.limits.queue_size, max(1, wait))
        job_id = uuid.uuid4().hex
        payload = {"body": body, "spec": spec.to_json(), "timeout_s": timeout_s, "rendezvous": rendezvous}
        job = await asyncio.to_thread(self.store.create, job_id, payload)
        if self._stopping:  # the shutdown began while the job was written: it runs after a restart
            log.info("check %s queued during shutdown; it runs after a restart", job_id)
            return job
        self._submitted[job_id] = time.monotonic()
        self._enqueue(job_id)
        token = job_id_var.set(job_id)
        try:
            log.info("check %s queued", job_id)
        finally:
            job_id_var.reset(token)
        return job

    def _enqueue(self, job_id: str) -> None:
        self._queued.add(job_id)
        self._queue.put_nowait(job_id)

    async def get(self, job_id: str) -> dict[str, Any]:
        job = await asyncio.to_thread(self.store.get, job_id)
        if job is None:
            raise no_such_check(job_id)
        return job

    async def list(self, limit: int, status: str | None) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.store.recent, limit, status)

    async def cancel(self, job_id: str) -> dict[str, Any]:
        job = await self.get(job_id)
        if job["status"] in FINISHED:
            raise Conflict(f"check {job_id} already {job['status']}")
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
            "models": self.describe_models(),
        }

    def describe_models(self) -> ModelList:
        """The built-in model and every registered one, with what its factory built (once a
        rank has built it: `loaded` null until then)."""
        out: ModelList = [
            {
                "name": SYNTHETIC,
                "loaded": True,
                "error": None,
                "description": "the built-in model: an 8-16-4 tanh MLP on synthetic samples, one per index",
                "parameters": 212,
                "dataset_size": None,
                "default": True,
            }
        ]
        for name in sorted(self.models):
            info = self.pool.models_info.get(name, {})
            out.append(
                {
                    "name": name,
                    "loaded": info.get("loaded"),
                    "error": info.get("error"),
                    "description": info.get("description"),
                    "parameters": info.get("parameters"),
                    "dataset_size": info.get("dataset_size"),
                    "default": False,
                }
            )
        return out

    # ------------------------------------------------------------------ running

    async def _runner(self) -> None:
        while True:
            job_id = await self._queue.get()
            if job_id not in self._queued:
                continue  # cancelled while waiting
            self._queued.discard(job_id)
            if not await asyncio.to_thread(self.store.start, job_id):
                continue
            token = job_id_var.set(job_id)  # the task copies the context: every line about the job
            try:
                task = asyncio.create_task(self._execute(job_id))
            finally:
                job_id_var.reset(token)
            self._executing.add(task)
            task.add_done_callback(self._executing.discard)
            self._running[job_id] = task
            try:
                await asyncio.wait({task})
            finally:
                self._running.pop(job_id, None)

    async def _execute(self, job_id: str) -> None:
        started = time.monotonic()
        timeout = self.limits.check_timeout_s
        status, result, error = FAILED, None, None
        log.info("check %s started", job_id)
        try:
            job = await self.get(job_id)
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
                error = SHUTTING_DOWN
            else:
                status, error = CANCELLED, "cancelled while running; its ranks were killed and replaced"
        except (RankDied, RankError) as err:
            error = f"{err}; the check's ranks were killed and replaced"
            if isinstance(err, RankDied) and err.by_shutdown_signal:
                # A SIGTERM to the whole process group (Ctrl-C, docker stop, systemd) reaches
                # the ranks as soon as the server: say so if the server's shutdown follows.
                error = await self._shutdown_follows(error)
        except Exception as err:
            log.exception("check %s failed", job_id)
            error = f"internal error: {type(err).__name__}: {err}"
        finally:
            self._submitted.pop(job_id, None)
        if self._stopping and status == FAILED and error is not None and not error.startswith(SHUTTING_DOWN):
            error = f"{SHUTTING_DOWN} ({error})"
        seconds = time.monotonic() - started
        passed = bool(result.get("passed")) if status == SUCCEEDED and result is not None else None
        log.info(
            "check %s %s%s",
            job_id,
            status,
            f": {error}" if error else "",
            extra={"status": status, "passed": passed, "duration_s": round(seconds, 6)},
        )
        for observer in self.observers:
            with contextlib.suppress(Exception):
                observer(status, passed, seconds)
        await self._record(job_id, status, result, error)

    async def _record(
        self, job_id: str, status: str, result: dict[str, Any] | None, error: str | None
    ) -> None:
        """Write a finished job, retrying while the database is locked or failing: a result
        is never dropped quietly. If every try fails the job stays `running` on disk, and
        the next start reports it failed with that reason."""
        delay = 0.25
        for attempt in range(1, FINISH_ATTEMPTS + 1):
            try:
                await asyncio.to_thread(self.store.finish, job_id, status, result=result, error=error)
                return
            except Exception:
                log.exception(
                    "check %s: recording its %s result failed (try %d of %d)",
                    job_id,
                    status,
                    attempt,
                    FINISH_ATTEMPTS,
                )
            if self._stopping and attempt >= 2:
                break  # a shutdown has seconds, not half a minute; the restart reports the job
            await asyncio.sleep(delay)
            delay = min(delay * 2, 4.0)
        log.error("check %s: its %s result could not be recorded; it is lost", job_id, status)

    async def _shutdown_follows(self, error: str) -> str:
        """`error`, or SHUTTING_DOWN when the server starts shutting down within the grace."""
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        try:
            while not self._stopping and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            pass  # stop() cancels the running checks: that is the shutdown too
        return SHUTTING_DOWN if self._stopping else error

    async def _run(self, job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        spec = CheckSpec.from_json(payload["spec"])
        if spec.model != SYNTHETIC and spec.model not in self.models:
            raise RankError(f"check model {spec.model!r} is no longer registered on this worker")
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
                "model_target": self.models.get(spec.model),
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
