"""Running queued jobs: a bounded number at a time, each on the check runner, each
recorded with its outcome however it ends (result, timeout, cancel, dead rank, shutdown)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from app.contract.check_result import CheckResult
from app.contract.jobs import JobStatus
from app.contract.model_registry import SYNTHETIC
from app.contract.spec import CheckSpec
from app.core.errors import NotFound
from app.logging_setup import job_id_var
from app.worker.service import reasons
from app.worker.service.limits import Limits
from app.worker.service.runner import (
    SHUTDOWN_GRACE_S,
    CheckOrder,
    CheckRunner,
    RankDied,
    RankError,
    RanksUnavailable,
)
from app.worker.service.store import INTERRUPTED, JobStore
from app.worker.service.submission import Submission
from app.worker.service.waiters import Waiters

log = logging.getLogger("batchplan.worker")

# What a check that the shutdown stopped records (status failed).
SHUTTING_DOWN = "server shutting down: " + INTERRUPTED
# A failing job database is tried again after RETRY_FIRST_S, doubling up to RETRY_MAX_S.
RETRY_FIRST_S = 0.25
RETRY_MAX_S = 8.0
# How long a cancel waits for the stopped job to be recorded before it answers.
CANCEL_WAIT_S = 5.0

# Called with (status, passed or None, seconds the check ran) whenever a check finishes.
FinishObserver = Callable[[str, bool | None, float], None]


def model_target(spec: CheckSpec, models: dict[str, str]) -> str | None:
    """The factory a check's model names, from this worker's registry as it is now (the
    model may have been unregistered by a restart since the job was queued)."""
    if spec.model != SYNTHETIC and spec.model not in models:
        raise RankError(f"check model {spec.model!r} is no longer registered on this worker")
    return models.get(spec.model)


class Execution:
    def __init__(self, store: JobStore, runner: CheckRunner, limits: Limits, models: dict[str, str]) -> None:
        self.store = store
        self.runner = runner
        self.limits = limits
        self.models = models
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.queued: set[str] = set()
        self.running: dict[str, asyncio.Task[None]] = {}
        self.recording: set[str] = set()  # running jobs that ended and are being written
        # Every _execute task until it has recorded its job: wait() waits for these, not for
        # `running`, which a worker task cancelled by begin_shutdown() empties before that.
        self._executing: set[asyncio.Task[None]] = set()
        self.submitted: dict[str, float] = {}
        self._workers: list[asyncio.Task[None]] = []
        self.stopping = False
        self.mean_check_s = 1.0
        self.observers: list[FinishObserver] = []
        self.waiters = Waiters()  # woken once a job is recorded finished

    def enqueue(self, job_id: str) -> None:
        self.queued.add(job_id)
        self.queue.put_nowait(job_id)

    def start(self) -> None:
        self._workers = [asyncio.create_task(self._work()) for _ in range(self.limits.concurrent_checks)]

    def begin_shutdown(self) -> None:
        """Take no more jobs off the queue and cancel the running ones."""
        self.stopping = True
        self.waiters.close()
        for worker in self._workers:
            worker.cancel()
        for task in self.running.values():
            task.cancel()

    async def wait(self) -> None:
        """Until every job that ran has been recorded."""
        await asyncio.gather(*self._workers, *self._executing, return_exceptions=True)

    async def cancel(self, job_id: str) -> None:
        """Stop the running job and wait (a while) until it is recorded; one already being
        recorded is left to finish its record, which a failing database may hold up."""
        task = self.running.get(job_id)
        if task is not None:
            if job_id not in self.recording:
                task.cancel()
            await asyncio.wait({task}, timeout=CANCEL_WAIT_S)

    async def _work(self) -> None:
        while True:
            job_id = await self.queue.get()
            if job_id not in self.queued:
                continue  # cancelled while waiting
            if not await self._start(job_id):
                continue
            token = job_id_var.set(job_id)  # the task copies the context: every line about the job
            try:
                task = asyncio.create_task(self._execute(job_id))
            finally:
                job_id_var.reset(token)
            self._executing.add(task)
            task.add_done_callback(self._executing.discard)
            self.running[job_id] = task
            try:
                await asyncio.wait({task})
            finally:
                self.running.pop(job_id, None)

    async def _start(self, job_id: str) -> bool:
        """Mark the job running; False when it is no longer queued. While the database fails
        (a full disk) the job stays queued and this worker waits for it: a worker that died
        here would leave every later job queued until a restart."""
        delay = RETRY_FIRST_S
        while True:
            try:
                started = await asyncio.to_thread(self.store.start, job_id)
            except sqlite3.Error as err:
                log.error(
                    "check %s could not start: the job database failed (%s); trying again in %g s",
                    job_id,
                    err,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                if job_id in self.queued:
                    continue
                return False  # cancelled meanwhile
            self.queued.discard(job_id)
            return started

    async def _execute(self, job_id: str) -> None:
        started = time.monotonic()
        timeout = self.limits.check_timeout_s
        status = JobStatus.FAILED
        result: CheckResult | None = None
        error: str | None = None
        order: CheckOrder | None = None
        log.info("check %s started", job_id)
        try:
            job = await asyncio.to_thread(self.store.get, job_id)
            if job is None:
                raise NotFound(f"no check with id {job_id!r}")
            submission = Submission.from_json(job.submission)
            timeout = submission.timeout_s
            order = self._order(job_id, submission)
            ran = await asyncio.wait_for(self.runner.run_check(order), timeout)
            status = JobStatus.SUCCEEDED
            submitted = self.submitted.pop(job_id, None)
            now = time.monotonic()
            waited = (started - submitted, now - submitted) if submitted is not None else (None, None)
            result = dataclasses.replace(ran, timings=ran.timings.with_service(now - started, *waited))
            self.mean_check_s = 0.8 * self.mean_check_s + 0.2 * (time.monotonic() - started)
        except TimeoutError:
            error = reasons.timed_out(timeout, order, self.runner)
        except RanksUnavailable as err:
            error = f"no rank process could start: {err}; the check did not run"
        except asyncio.CancelledError:
            if self.stopping:
                error = SHUTTING_DOWN
            else:
                status = JobStatus.CANCELLED
                error = "cancelled while running; its ranks were killed and replaced"
                if order is None or not order.progress.holding:
                    # Before it held ranks, whether or not it had begun to wait for them.
                    error = "cancelled while it waited for free rank processes; nothing ran"
        except RankError as err:
            error = reasons.model_error(job_id, err)
        except RankDied as err:
            error = f"{err}; the check's ranks were killed and replaced"
            if err.by_shutdown_signal:
                # A SIGTERM to the whole process group (Ctrl-C, docker stop, systemd) reaches
                # the ranks as soon as the server: say so if the server's shutdown follows.
                error = await self._shutdown_follows(error)
        except Exception as err:
            log.exception("check %s failed", job_id)
            error = f"internal error: {type(err).__name__}: {err}"
        finally:
            self.submitted.pop(job_id, None)
        if (
            self.stopping
            and status == JobStatus.FAILED
            and error is not None
            and not error.startswith(SHUTTING_DOWN)
        ):
            error = f"{SHUTTING_DOWN} ({error})"
        seconds = time.monotonic() - started
        passed = result.passed if status == JobStatus.SUCCEEDED and result is not None else None
        log.info(
            "check %s %s%s",
            job_id,
            status.value,
            f": {error}" if error else "",
            extra={"status": status.value, "passed": passed, "duration_s": round(seconds, 6)},
        )
        for observer in self.observers:
            with contextlib.suppress(Exception):
                observer(status.value, passed, seconds)
        self.recording.add(job_id)
        try:
            await self._record(job_id, status, result.to_json() if result is not None else None, error)
        finally:
            self.recording.discard(job_id)

    def _order(self, job_id: str, submission: Submission) -> CheckOrder:
        spec = submission.spec
        return CheckOrder(
            job_id=job_id,
            spec=spec,
            timeout_s=submission.timeout_s,
            rendezvous=submission.rendezvous,
            model_target=model_target(spec, self.models),
        )

    async def _record(
        self, job_id: str, status: JobStatus, result: dict[str, Any] | None, error: str | None
    ) -> None:
        """Write a finished job, retrying while the database is locked or failing (a full
        disk): a result is never dropped quietly, and the job's worker waits with it. A
        shutdown tries twice; then the job stays `running` on disk, and the next start
        reports it failed with that reason."""
        delay = RETRY_FIRST_S
        attempt = 0
        while True:
            attempt += 1
            try:
                await asyncio.to_thread(self.store.finish, job_id, status, result=result, error=error)
                self.waiters.notify(job_id)
                return
            except Exception as err:
                log.error(
                    "check %s: recording its %s result failed (try %d): %s",
                    job_id,
                    status.value,
                    attempt,
                    err,
                )
            if self.stopping and attempt >= 2:
                break  # a shutdown has seconds; the restart reports the job
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
        log.error("check %s: its %s result could not be recorded; it is lost", job_id, status.value)

    async def _shutdown_follows(self, error: str) -> str:
        """`error`, or SHUTTING_DOWN when the server starts shutting down within the grace."""
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        try:
            while not self.stopping and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            pass  # stop() cancels the running checks: that is the shutdown too
        return SHUTTING_DOWN if self.stopping else error
