"""The check service: a bounded queue of jobs in SQLite, run on a check runner (the warm
rank pool), and what the routers ask of the worker.

Everything blocking happens in rank processes or worker threads; the event loop only
passes messages, so /v1/plans stays fast while a check runs. Deciding whether a check is
taken lives in admission, running the taken ones in execution.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import math
import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from app.contract.codec import encode
from app.contract.host import BUILT_IN, HostDescription, ModelDescription, registered_model
from app.contract.jobs import Job, JobStatus
from app.core.errors.domain import Busy, NotFound, Unavailable
from app.logging_setup import job_id_var
from app.worker.service.admission import Admission
from app.worker.service.execution import Execution, FinishObserver
from app.worker.service.limits import Limits
from app.worker.service.probe_cost import ProbeCost
from app.worker.service.runner import CheckRunner
from app.worker.service.store import JobStore, database_failed
from app.worker.service.submission import Submission

__all__ = ["CheckService"]

log = logging.getLogger("batchplan.worker")

T = TypeVar("T")


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


class CheckService:
    def __init__(
        self,
        jobs_db: Path,
        limits: Limits,
        models: dict[str, str] | None = None,
        runner: CheckRunner | None = None,
    ) -> None:
        self.limits = limits
        self.models = dict(models or {})  # registered check models: name -> package.module:factory
        self.store = JobStore(jobs_db)
        if runner is None:
            from app.worker.service.pool import RankPool

            runner = RankPool(limits.processes_per_host, self.models)
        self.runner: CheckRunner = runner
        # A check request as JSON to the job to submit, planned and held against this worker
        # (blocking: run it in a thread).
        self.probe_cost = ProbeCost()  # measured from finished probes, read by admission
        self.admission = Admission(limits, self.models, runner, self.probe_cost)
        self.prepare = self.admission.prepare
        self._execution = Execution(self.store, runner, limits, self.models, self.admission)
        self._stopped = False

    @property
    def observers(self) -> list[FinishObserver]:
        return self._execution.observers

    @property
    def shutting_down(self) -> bool:
        return self._execution.stopping

    def waited_for(self) -> int:
        """Jobs with a GET ?wait= event, kept until each finishes."""
        return len(self._execution.waiters)

    def waiting_now(self) -> int:
        """Jobs that some GET ?wait= request waits for now."""
        return self._execution.waiters.waiting()

    def queue_depth(self) -> int:
        return self._execution.queued()

    def running_count(self) -> int:
        return self._execution.running()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        waiting = await asyncio.to_thread(self.store.recover)
        for job_id in waiting:
            if self.queue_depth() < self.limits.queue_size:
                self._execution.enqueue(job_id)
            else:
                await asyncio.to_thread(
                    self.store.finish,
                    job_id,
                    JobStatus.FAILED,
                    error="the queue was full when the server restarted",
                )
        self.runner.start()
        self._execution.start()

    def begin_shutdown(self) -> None:
        """The first step of a shutdown, safe to call early (from a SIGTERM) and repeatedly:
        refuse new checks, start no more rank processes, cancel the running checks (each
        records SHUTTING_DOWN). Queued checks stay queued in the database and run after a
        restart. `stop()` then waits for all of it and ends every process."""
        if self.shutting_down:
            return
        self.runner.begin_stop()
        log.info(
            "shutting down: %d running checks cancelled, %d queued kept for the next start",
            self.running_count(),
            self.queue_depth(),
        )
        self._execution.begin_shutdown()

    async def stop(self) -> None:
        """Shut down and wait until every check is recorded and every process the runner
        started has exited (and been reaped)."""
        if self._stopped:
            return
        self._stopped = True
        self.begin_shutdown()
        await self._execution.wait()
        await self.runner.stop()
        await asyncio.to_thread(self.store.close)

    # ------------------------------------------------------------------ requests

    async def _db(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A store call in a thread; its database's failure as a 503 that says so."""
        try:
            return await asyncio.to_thread(call, *args, **kwargs)
        except sqlite3.Error as err:
            log.error("the job database %s failed: %s", self.store.path, err)
            raise database_failed(self.store.path, err) from err

    async def submit(self, submission: Submission) -> Job:
        """Store `submission` (from `prepare`) as a queued job and queue it."""
        if self.shutting_down:
            raise shutting_down()
        if self.queue_depth() >= self.limits.queue_size:
            busy = self.queue_depth() + self.running_count()
            wait = math.ceil(self._execution.mean_check_s * busy / self.limits.concurrent_checks)
            raise queue_full(self.limits.queue_size, max(1, wait))
        job_id = uuid.uuid4().hex
        job = await self._db(self.store.create, job_id, encode(submission))
        if self.shutting_down:  # the shutdown began while the job was written: it runs after a restart
            log.info("check %s queued during shutdown; it runs after a restart", job_id)
            return job
        self._execution.enqueue(job_id, submitted=time.monotonic(), submission=submission)
        token = job_id_var.set(job_id)
        try:
            log.info("check %s queued", job_id)
        finally:
            job_id_var.reset(token)
        return job

    async def get(self, job_id: str, wait_s: float = 0.0) -> Job:
        """The job; with `wait_s`, once it has finished or after `wait_s` seconds, whichever
        comes first."""
        if wait_s <= 0:
            return await self._read(job_id)
        waiters = self._execution.waiters
        finished = waiters.register(job_id)
        try:
            job = await self._read(job_id)
        except NotFound:
            waiters.notify(job_id)  # nothing to wait for: leave no event behind
            raise
        if job.status.finished:
            # Recorded, perhaps not yet announced: wake any other waiter, leave no event.
            waiters.notify(job_id)
            return job
        await waiters.wait(job_id, finished, wait_s)
        return await self._read(job_id)

    async def _read(self, job_id: str) -> Job:
        job = self.store.cached(job_id) or await self._db(self.store.get, job_id)
        if job is None:
            raise no_such_check(job_id)
        return job

    async def list(self, limit: int, status: JobStatus | None) -> list[Job]:
        return await self._db(self.store.recent, limit, status)

    async def cancel(self, job_id: str) -> Job:
        job = await self.get(job_id)
        job.check_transition(JobStatus.CANCELLED)  # a conflict once it has finished
        recording = await self._execution.cancel(job_id)
        job = await self.get(job_id)
        if not job.status.finished and recording:
            raise Unavailable(
                f"check {job_id} was stopped, but the job database has not recorded it yet (it keeps "
                "trying); ask again in a moment",
                retry_after=10,
            )
        return job

    # ------------------------------------------------------------------ the host

    def host(self) -> HostDescription:
        info = self.runner.host_info
        warm = self.runner.warm()
        ready = len(warm) >= self.runner.size
        return HostDescription(
            worker_enabled=True,
            ready=ready,
            not_ready_reason=None if ready else self._not_ready_reason(len(warm)),
            failing=self.runner.failing,
            processes_per_host=self.runner.size,
            warm_processes=len(warm),
            busy_processes=sum(1 for p in warm if p.busy),
            processes=self.runner.describe(),
            gpus=info.gpus,
            gpu_names=info.gpu_names,
            cuda_available=info.cuda_available,
            backends=info.backends,
            torch_version=info.torch_version,
            spawn_error=self.runner.spawn_error,
            queued=self.queue_depth(),
            running=self.running_count(),
            queue_size=self.limits.queue_size,
            concurrent_checks=self.limits.concurrent_checks,
            max_replicas_per_check=self.limits.max_replicas_per_check,
            check_timeout_s=self.limits.check_timeout_s,
            models=self.describe_models(),
        )

    def _not_ready_reason(self, warm: int) -> str:
        if self.runner.failing is not None:
            return self.runner.failing
        reason = f"{warm} of {self.runner.size} rank processes warm; the others are starting"
        if self.runner.spawn_error:
            reason += f" (the last start failed: {self.runner.spawn_error})"
        return reason

    def describe_models(self) -> builtins.list[ModelDescription]:
        """The built-in model and every registered one, with what its factory built (once a
        rank has built it: `status` pending and `loaded` null until then)."""
        built = self.runner.models_info
        return [BUILT_IN, *(registered_model(name, built.get(name)) for name in sorted(self.models))]
