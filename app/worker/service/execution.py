"""Running queued jobs: a bounded number at a time, each on the check runner, each
recorded with its outcome however it ends (result, timeout, cancel, dead rank, shutdown)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from app.core.errors import NotFound
from app.core.jobs import JobStatus
from app.core.model_registry import SYNTHETIC
from app.logging_setup import job_id_var
from app.worker.contract.check_result import CheckResult
from app.worker.contract.spec import CheckSpec
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

log = logging.getLogger("batchplan.worker")

# What a check that the shutdown stopped records (status failed).
SHUTTING_DOWN = "server shutting down: " + INTERRUPTED
# Tries to write a finished job (about 30 s in all) before giving up on the database.
FINISH_ATTEMPTS = 9

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
        # Every _execute task until it has recorded its job: wait() waits for these, not for
        # `running`, which a worker task cancelled by begin_shutdown() empties before that.
        self._executing: set[asyncio.Task[None]] = set()
        self.submitted: dict[str, float] = {}
        self._workers: list[asyncio.Task[None]] = []
        self.stopping = False
        self.mean_check_s = 1.0
        self.observers: list[FinishObserver] = []

    def enqueue(self, job_id: str) -> None:
        self.queued.add(job_id)
        self.queue.put_nowait(job_id)

    def start(self) -> None:
        self._workers = [asyncio.create_task(self._work()) for _ in range(self.limits.concurrent_checks)]

    def begin_shutdown(self) -> None:
        """Take no more jobs off the queue and cancel the running ones."""
        self.stopping = True
        for worker in self._workers:
            worker.cancel()
        for task in self.running.values():
            task.cancel()

    async def wait(self) -> None:
        """Until every job that ran has been recorded."""
        await asyncio.gather(*self._workers, *self._executing, return_exceptions=True)

    async def cancel(self, job_id: str) -> None:
        task = self.running.get(job_id)
        if task is not None:
            task.cancel()
            await asyncio.wait({task})

    async def _work(self) -> None:
        while True:
            job_id = await self.queue.get()
            if job_id not in self.queued:
                continue  # cancelled while waiting
            self.queued.discard(job_id)
            if not await asyncio.to_thread(self.store.start, job_id):
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
            error = self._timed_out(timeout, order)
        except RanksUnavailable as err:
            error = f"no rank process could start: {err}; the check did not run"
        except asyncio.CancelledError:
            if self.stopping:
                error = SHUTTING_DOWN
            else:
                status = JobStatus.CANCELLED
                error = "cancelled while running; its ranks were killed and replaced"
                if order is not None and order.progress.waiting_for and not order.progress.holding:
                    error = "cancelled while it waited for free rank processes; nothing ran"
        except RankError as err:
            error = self._model_error(job_id, err)
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
        await self._record(job_id, status, result.to_json() if result is not None else None, error)

    @staticmethod
    def _model_error(job_id: str, err: RankError) -> str:
        """A rank's error for the job: with the model's traceback when the model raised it."""
        if err.ranks_kept:
            error = f"the model raised {err}; the check's ranks were kept"
        else:
            error = f"{err}; the check's ranks were killed and replaced"
        if err.traceback:
            log.warning("check %s: the model raised\n%s", job_id, err.traceback)
            error += "\n" + err.traceback
        return error

    def _order(self, job_id: str, submission: Submission) -> CheckOrder:
        spec = submission.spec
        return CheckOrder(
            job_id=job_id,
            spec=spec,
            timeout_s=submission.timeout_s,
            rendezvous=submission.rendezvous,
            model_target=model_target(spec, self.models),
        )

    def _timed_out(self, timeout: float, order: CheckOrder | None) -> str:
        """Why a check ended at its timeout: it ran too long on its ranks, or it never got
        them (then nothing was killed, and the pool's state says why)."""
        progress = order.progress if order is not None else None
        if progress is not None and progress.waiting_for and not progress.holding:
            warm = self.runner.warm()
            free = sum(1 for r in warm if not r.busy)
            state = f"{len(warm)} of {self.runner.size} warm, {free} free"
            if self.runner.spawn_error:
                state += f"; the last start failed: {self.runner.spawn_error}"
            return (
                f"{progress.waiting_for} rank processes were not free within timeout_s={timeout:g} "
                f"({state}); the check did not run"
            )
        error = f"the check did not finish within timeout_s={timeout:g}"
        if progress is not None and progress.holding:
            error += "; its ranks were killed and replaced"
        return error

    async def _record(
        self, job_id: str, status: JobStatus, result: dict[str, Any] | None, error: str | None
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
                    status.value,
                    attempt,
                    FINISH_ATTEMPTS,
                )
            if self.stopping and attempt >= 2:
                break  # a shutdown has seconds, not half a minute; the restart reports the job
            await asyncio.sleep(delay)
            delay = min(delay * 2, 4.0)
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
