"""Opening the job database: one server at a time, an SQLite file this version can read, or a
clear error. Never a silent reset, and never a change to a file that is not ours.

Two servers on one database would each fail the other's running jobs at start-up and run its
queued ones twice, so a server holds an exclusive lock on the file while it runs (flock: the
kernel drops it when the process dies, however it dies). The schema's version is SQLite's
`user_version`: a database written by a newer batchplan is refused rather than misread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from pathlib import Path

SCHEMA_VERSION = 1
# `request` holds the job's Submission as JSON (the column keeps its first name: databases
# outlive versions).
SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    started_at TEXT,
    finished_at TEXT,
    request TEXT NOT NULL,
    result TEXT,
    error TEXT
);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_at);
"""
COLUMNS = {"id", "status", "created_at", "started_at", "finished_at", "request", "result", "error"}
USE_ANOTHER = "point BATCHPLAN_JOBS_DB at another file"


class UnusableJobDatabase(OSError):
    """The job database cannot be used by this server; the message says why and what to do
    (the caller names the file)."""


def lock(path: Path) -> int:
    """An exclusive lock on the database file (created if missing), held until the returned
    descriptor is closed: after the SQLite connection, since closing any descriptor of the
    file drops that process's SQLite locks on it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise UnusableJobDatabase(
            f"in use by another server{f' (pid {holder})' if holder else ''}: a job database "
            f"serves one server at a time; stop that one, or {USE_ANOTHER}"
        ) from None
    return fd


def _holder(fd: int) -> int | None:
    """The pid that holds an flock on the file of `fd`, from /proc/locks (Linux), if found."""
    stat = os.fstat(fd)
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if fields[1] == "FLOCK" and fields[5] == device:
                return int(fields[4])
    return None


def prepare(db: sqlite3.Connection) -> None:
    """Check that `db` is an SQLite file with batchplan's jobs (or nothing yet) at a schema
    this version reads, then create what is missing and switch it to WAL."""
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as err:
        raise UnusableJobDatabase(
            f"not an SQLite database ({err}); it is left as it is: move it away, or {USE_ANOTHER}"
        ) from None
    if version > SCHEMA_VERSION:
        raise UnusableJobDatabase(
            f"job database schema {version}, written by a newer batchplan; this one reads schema "
            f"{SCHEMA_VERSION}: run the newer batchplan, or {USE_ANOTHER}"
        )
    if tables and "jobs" not in tables:
        raise UnusableJobDatabase(
            f"an SQLite database without batchplan's jobs (its tables: {', '.join(sorted(tables))}); "
            f"it is left as it is: {USE_ANOTHER}"
        )
    if "jobs" in tables:
        missing = COLUMNS - {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
        if missing:
            raise UnusableJobDatabase(
                f"a jobs table without the columns {', '.join(sorted(missing))}: not a batchplan "
                f"job database; it is left as it is: {USE_ANOTHER}"
            )
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(SCHEMA)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
