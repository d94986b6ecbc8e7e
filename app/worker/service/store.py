"""Check jobs in SQLite, so that results outlive the process that computed them."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.contract.codec import json_text
from app.contract.jobs import Job, JobStatus
from app.core.errors.domain import Unavailable
from app.worker.service import store_file

INTERRUPTED = "the server stopped while this check was running; submit it again"


def database_failed(path: Path, err: sqlite3.Error) -> Unavailable:
    """The job database failed a read or write (full disk, a lock held too long)."""
    return Unavailable(
        f"the job database {path} failed ({err}): checks cannot be stored or read until it works "
        "again; the planner still serves",
        retry_after=10,
    )


def _as_served(text: str) -> str:
    """A stored result as GET serves it. This server stores it so (`codec.json_text`); a row an
    older server wrote holds json.dumps's default form (a space after each `:` and `,`,
    non-ASCII escaped), written again here so that every job is answered in one form. The
    first key's `:` tells them apart (a codec key holds no quote)."""
    colon = text.find('":')
    if colon < 0 or not text.startswith(" ", colon + 2):
        return text
    return json_text(json.loads(text))


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# The jobs last written or read, kept in memory: a client polls a running check every few
# milliseconds, and a thread hop to read it from the database costs more server CPU than the
# rest of the answer (bench/bench_checks.py polls the same way).
RECENT_JOBS = 256


class JobStore:
    """One connection behind a lock: calls are short, and the service makes them from
    worker threads so the event loop never waits on the disk. `cached` answers from memory on
    the event loop: this process is the only writer (store_file's lock), and every write
    refreshes the job it changed there, in the database's order (under the same lock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._recent: OrderedDict[str, Job] = OrderedDict()
        self._recent_lock = threading.Lock()  # never held across a database call
        self._file = store_file.lock(path)  # refused while another server has it
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=10)
            self._db.row_factory = sqlite3.Row
            store_file.prepare(self._db)
        except BaseException:
            with contextlib.suppress(Exception):
                self._db.close()
            os.close(self._file)
            raise

    def close(self) -> None:
        with self._lock:
            self._db.close()
            if self._file >= 0:
                os.close(self._file)  # last: this lets another server open the file
                self._file = -1

    @staticmethod
    def _job(row: sqlite3.Row | None) -> Job | None:
        """A job read from the file: its submission parsed (the job outlived what memory holds),
        its result kept as the text it is served as."""
        if row is None:
            return None
        return Job(
            id=row["id"],
            status=JobStatus(row["status"]),
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            submission=json.loads(row["request"]),
            result_json=_as_served(row["result"]) if row["result"] else None,
            error=row["error"],
        )

    def create(self, job_id: str, submission: Mapping[str, Any]) -> Job:
        """Store a queued job: `submission` is the codec's JSON of the worker's Submission. The
        job remembered is what was written, not read back."""
        job = Job(id=job_id, status=JobStatus.QUEUED, created_at=now(), submission=submission)
        with self._lock, self._forgotten_on_failure(job_id):
            self._db.execute(
                "INSERT INTO jobs (id, status, created_at, request) VALUES (?, ?, ?, ?)",
                (job_id, job.status.value, job.created_at, json.dumps(submission)),
            )
            self._remember(job)
        return job

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._read(job_id)

    def cached(self, job_id: str) -> Job | None:
        """The job as last written or read, if it is among the recent ones; no disk."""
        with self._recent_lock:
            return self._recent.get(job_id)

    def _read(self, job_id: str) -> Job | None:
        """The job from the database, remembered as the latest; call under `_lock`, so that
        no older read is remembered after a newer write."""
        with self._forgotten_on_failure(job_id):
            job = self._job(self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone())
        if job is not None:
            self._remember(job)
        return job

    def _remember(self, job: Job) -> None:
        with self._recent_lock:
            self._recent[job.id] = job
            self._recent.move_to_end(job.id)
            while len(self._recent) > RECENT_JOBS:
                self._recent.popitem(last=False)

    def _changed(self, job_id: str, **fields: Any) -> None:
        """A write to the job's row that took effect, made to the job memory holds as well (if
        it holds it: one it does not is read from the file when it is asked for)."""
        with self._recent_lock:
            job = self._recent.get(job_id)
        if job is not None:
            self._remember(dataclasses.replace(job, **fields))

    @contextlib.contextmanager
    def _forgotten_on_failure(self, job_id: str) -> Iterator[None]:
        """Around a database call: should it fail, memory forgets the job (a write may or may
        not have landed), and the next ask reads the file."""
        try:
            yield
        except BaseException:
            with self._recent_lock:
                self._recent.pop(job_id, None)
            raise

    def recent(self, limit: int, status: JobStatus | None = None) -> list[Job]:
        query = (
            "SELECT * FROM jobs"
            + (" WHERE status = ?" if status else "")
            + " ORDER BY created_at DESC, rowid DESC LIMIT ?"
        )
        with self._lock:
            rows = self._db.execute(query, (status.value, limit) if status else (limit,)).fetchall()
        return [job for job in map(self._job, rows) if job is not None]

    def start(self, job_id: str) -> bool:
        """queued → running; False when it is no longer queued (cancelled meanwhile)."""
        (source,) = JobStatus.RUNNING.sources()
        started = now()
        with self._lock, self._forgotten_on_failure(job_id):
            cursor = self._db.execute(
                "UPDATE jobs SET status = ?, started_at = ? WHERE id = ? AND status = ?",
                (JobStatus.RUNNING.value, started, job_id, source.value),
            )
            if cursor.rowcount == 1:
                self._changed(job_id, status=JobStatus.RUNNING, started_at=started)
        return cursor.rowcount == 1

    def finish(
        self,
        job_id: str,
        status: JobStatus,
        *,
        result: str | None = None,
        error: str | None = None,
    ) -> None:
        """Move the job to finished `status` if its status allows it; a job already finished
        (cancelled while its result came in) keeps what it has. `result` is the CheckResult's
        JSON text as GET serves it (`codec.json_text`): stored, and remembered, as it is."""
        if not status.finished:
            raise ValueError(f"{status} is not a finished status")
        sources = [s.value for s in status.sources()]
        finished = now()
        with self._lock, self._forgotten_on_failure(job_id):
            cursor = self._db.execute(
                "UPDATE jobs SET status = ?, finished_at = ?, result = ?, error = ? "
                f"WHERE id = ? AND status IN ({', '.join('?' * len(sources))})",
                (status.value, finished, result, error, job_id, *sources),
            )
            if cursor.rowcount == 1:
                self._changed(job_id, status=status, finished_at=finished, result_json=result, error=error)

    def recover(self) -> list[str]:
        """After a restart: running jobs failed (their ranks died with the server); the ids
        of queued ones, oldest first, to run again."""
        with self._lock:
            self._db.execute(
                "UPDATE jobs SET status = ?, finished_at = ?, error = ? WHERE status = ?",
                (JobStatus.FAILED.value, now(), INTERRUPTED, JobStatus.RUNNING.value),
            )
            rows = self._db.execute(
                "SELECT id FROM jobs WHERE status = ? ORDER BY created_at, rowid", (JobStatus.QUEUED.value,)
            ).fetchall()
            with self._recent_lock:
                self._recent.clear()
        return [row["id"] for row in rows]
