"""Running queued jobs: a bounded number at a time, each on the check runner, each
recorded with its outcome however it ends (result, timeout, cancel, dead rank, shutdown).

Two lanes, each its own queue and workers: long checks (the lr-scaling probes, which train
for minutes) one at a time in theirs, every other check in the short lane
(`concurrent_checks` at a time). A short check is then never queued behind a probe, and the
pool leaves it a rank while a probe runs (pool.lane_cap): a second lane rather than a
time-sliced queue, because a rank in a check cannot be paused, only killed.

Each job this server holds, from its submission until it is recorded finished, has one
`JobState`, kept by `Execution` under its id: whether it is queued or running (its task),
whether its record is being written, when it was submitted. Nothing else holds a job's
state.

Over 300 lines: one concept, a job's way from its lane's queue to its record, every ending
(result, timeout, cancel, dead rank, shutdown, a failing database) handled here."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sqlite3
import time
from collections.abc import Callable

from app.contract.codec import encode, json_text
from app.contract.jobs import JobStatus
from app.contract.timings import with_service
from app.core.errors.domain import NotFound
from app.logging_setup import job_id_var
from app.worker.service import reasons
from app.worker.service.admission import Admission
from app.worker.service.job_state import JobState, Outcome, model_target, stored_submission
from app.worker.service.limits import Limits
from app.worker.service.runner import (
    SHUTDOWN_GRACE_S,
    CheckOrder,
    CheckRunner,
    RankDied,
    RankError,
    RanksUnavailable,
)
from app.worker.service.store import INTERRUPTED, JobStore, database_failed
from app.worker.service.submission import Submission
from app.worker.service.waiters import Waiters

log = logging.getLogger("batchplan.worker")

# What a check that the shutdown stopped records (status failed).
SHUTTING_DOWN = "server shutting down: " + INTERRUPTED
CANCELLED_WAITING = "cancelled while it waited for free rank processes; nothing ran"
CANCELLED_RUNNING = "cancelled while running; its ranks were killed and replaced"
# A failing job database is tried again after RETRY_FIRST_S, doubling up to RETRY_MAX_S.
RETRY_FIRST_S = 0.25
RETRY_MAX_S = 8.0
# How long a cancel waits for the stopped job to be recorded before it answers.
CANCEL_WAIT_S = 5.0

# Called with (status, passed or None, seconds the check ran) whenever a check finishes.
FinishObserver = Callable[[str, bool | None, float], None]


class Execution:
    def __init__(
        self,
        store: JobStore,
        runner: CheckRunner,
        limits: Limits,
        models: dict[str, str],
        admission: Admission | None = None,
    ) -> None:
        self.store = store
        # Told each finished probe's time (its cost per sample, which admission estimates by).
        self.admission = admission
        self.runner = runner
        self.limits = limits
        self.models = models
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.long_queue: asyncio.Queue[str] = asyncio.Queue()
        self.jobs: dict[str, JobState] = {}
        self._workers: list[asyncio.Task[None]] = []
        self.stopping = False
        self.mean_check_s = 1.0
        self.observers: list[FinishObserver] = []
        self.waiters = Waiters()  # woken once a job is recorded finished

    def queued(self) -> int:
        return sum(1 for j in self.jobs.values() if j.queued)

    def running(self) -> int:
        return sum(1 for j in self.jobs.values() if not j.queued)

    def enqueue(
        self, job_id: str, submitted: float | None = None, submission: Submission | None = None
    ) -> None:
        self.jobs[job_id] = JobState(job_id, submitted, submission)
        # A job queued before a restart (its spec still on disk) runs in the short lane.
        long = submission is not None and is_long(submission)
        (self.long_queue if long else self.queue).put_nowait(job_id)

    def start(self) -> None:
        short = [asyncio.create_task(self._work(self.queue)) for _ in range(self.limits.concurrent_checks)]
        self._workers = [*short, asyncio.create_task(self._work(self.long_queue))]

    def begin_shutdown(self) -> None:
        """Take no more jobs off the queue and cancel the running ones."""
        self.stopping = True
        self.waiters.close()
        for worker in self._workers:
            worker.cancel()
        for job in self.jobs.values():
            job.stop()

    async def wait(self) -> None:
        """Until every job that ran has been recorded (a job leaves `jobs` once it is)."""
        tasks = [j.task for j in self.jobs.values() if j.task is not None]
        await asyncio.gather(*self._workers, *tasks, return_exceptions=True)

    async def cancel(self, job_id: str) -> bool:
        """Cancel the job: a queued one is recorded cancelled at once, a running one is stopped
        and waited for (a while) until it is recorded. True while it is still being recorded."""
        job = self.jobs.get(job_id)
        if job is None:
            return False
        if job.queued:
            del self.jobs[job_id]  # a worker that takes it off the queue now passes it by
            try:
                await asyncio.to_thread(
                    self.store.finish, job_id, JobStatus.CANCELLED, error="cancelled before it started"
                )
            except sqlite3.Error as err:
                self.jobs[job_id] = job  # still queued on disk: so it stays here
                raise database_failed(self.store.path, err) from err
            self.waiters.notify(job_id)
            return False
        task = job.stop()
        if task is not None:
            await asyncio.wait({task}, timeout=CANCEL_WAIT_S)
        return job_id in self.jobs

    async def _work(self, queue: asyncio.Queue[str]) -> None:
        while True:
            job = self.jobs.get(await queue.get())
            if job is None or not job.queued or not await self._start(job):
                continue  # cancelled while it waited
            token = job_id_var.set(job.id)  # the task copies the context: every line about the job
            try:
                job.task = asyncio.create_task(self._execute(job))
            finally:
                job_id_var.reset(token)
            await asyncio.wait({job.task})

    async def _start(self, job: JobState) -> bool:
        """Mark the job running; False when it is no longer queued. While the database fails
        (a full disk) the job stays queued and this worker waits for it: a worker that died
        here would leave every later job queued until a restart."""
        delay = RETRY_FIRST_S
        while True:
            try:
                started: bool = await asyncio.to_thread(self.store.start, job.id)
            except sqlite3.Error as err:
                log.error(
                    "check %s could not start: the job database failed (%s); trying again in %g s",
                    job.id,
                    err,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                if self.jobs.get(job.id) is job:
                    continue
                return False  # cancelled meanwhile
            if not started:
                self.jobs.pop(job.id, None)
            return started

    async def _execute(self, job: JobState) -> None:
        started = time.monotonic()
        log.info("check %s started", job.id)
        try:
            outcome, result = _as_stored(await self._outcome(job, started))
            seconds = time.monotonic() - started
            self._observe(job.id, outcome, seconds)
            job.recording = True
            await self._record(job.id, outcome, result)
        finally:
            self.jobs.pop(job.id, None)

    async def _outcome(self, job: JobState, started: float) -> Outcome:
        """Run the job's check: how it ended, whichever way."""
        order: CheckOrder | None = None
        timeout = self.limits.check_timeout_s
        try:
            submission = job.submission or await self._stored(job.id)
            timeout = submission.timeout_s
            order = self._order(job.id, submission)
            ran = await asyncio.wait_for(self.runner.run_check(order), timeout)
        except TimeoutError:
            return self._failed(reasons.timed_out(timeout, order, self.runner))
        except RanksUnavailable as err:
            return self._failed(f"no rank process could start: {err}; the check did not run")
        except asyncio.CancelledError:
            return self._cancelled(order)
        except RankError as err:
            return self._failed(reasons.model_error(job.id, err))
        except RankDied as err:
            error = f"{err}; the check's ranks were killed and replaced"
            if err.by_shutdown_signal:
                # A SIGTERM to the whole process group (Ctrl-C, docker stop, systemd) reaches
                # the ranks as soon as the server: say so if the server's shutdown follows.
                error = await self._shutdown_follows(error)
            return self._failed(error)
        except Exception as err:
            log.exception("check %s failed", job.id)
            return self._failed(f"internal error: {type(err).__name__}: {err}")
        now = time.monotonic()
        waited = (started - job.submitted, now - job.submitted) if job.submitted is not None else (None, None)
        self.mean_check_s = 0.8 * self.mean_check_s + 0.2 * (now - started)
        timed = dataclasses.replace(ran, timings=with_service(ran.timings, now - started, *waited))
        if self.admission is not None and order.spec.lr_scaling is not None:
            ranks = self.admission.probe_ranks(order.spec)
            self.admission.probe_cost.observe(order.spec.lr_scaling, ranks, ran.timings.get("lr_scaling"))
        return Outcome(JobStatus.SUCCEEDED, timed)

    async def _stored(self, job_id: str) -> Submission:
        """The submission of a job queued before a restart, from the job store."""
        stored = await asyncio.to_thread(self.store.get, job_id)
        if stored is None:
            raise NotFound(f"no check with id {job_id!r}")
        return stored_submission(stored.submission)

    def _failed(self, error: str) -> Outcome:
        if self.stopping and not error.startswith(SHUTTING_DOWN):
            error = f"{SHUTTING_DOWN} ({error})"
        return Outcome(JobStatus.FAILED, error=error)

    def _cancelled(self, order: CheckOrder | None) -> Outcome:
        if self.stopping:
            return Outcome(JobStatus.FAILED, error=SHUTTING_DOWN)
        if order is None or not order.progress.holding:
            # Before it held ranks, whether or not it had begun to wait for them.
            return Outcome(JobStatus.CANCELLED, error=CANCELLED_WAITING)
        return Outcome(JobStatus.CANCELLED, error=CANCELLED_RUNNING)

    def _observe(self, job_id: str, outcome: Outcome, seconds: float) -> None:
        status, error = outcome.status, outcome.error
        passed = outcome.result.passed if outcome.result is not None else None
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

    def _order(self, job_id: str, submission: Submission) -> CheckOrder:
        spec = submission.spec
        return CheckOrder(
            job_id=job_id,
            spec=spec,
            timeout_s=submission.timeout_s,
            rendezvous=submission.rendezvous,
            model_target=model_target(spec, self.models),
            long=is_long(submission),
        )

    async def _record(self, job_id: str, outcome: Outcome, result: str | None) -> None:
        """Write a finished job, retrying while the database is locked or failing (a full
        disk): a result is never dropped quietly, and the job's worker waits with it. A
        shutdown tries twice; then the job stays `running` on disk, and the next start
        reports it failed with that reason."""
        status, error = outcome.status, outcome.error
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


def is_long(submission: Submission) -> bool:
    """A check that runs in the long lane: an lr-scaling probe."""
    return submission.spec.lr_scaling is not None


def _as_stored(outcome: Outcome) -> tuple[Outcome, str | None]:
    """`outcome`, and its result as the JSON text the job store keeps and GET serves (written
    once, here). A result that JSON cannot carry (a NaN, a string no UTF-8 holds) fails the
    job, saying so, rather than a write retried forever or a GET that fails every time."""
    if outcome.result is None:
        return outcome, None
    try:
        text = json_text(encode(outcome.result))
        text.encode()  # as SQLite will store it
    except ValueError as err:
        return Outcome(JobStatus.FAILED, error=f"internal error: the check's result is not JSON: {err}"), None
    return outcome, text
