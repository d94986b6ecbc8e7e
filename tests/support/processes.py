"""Processes read from /proc: which are alive (a zombie has exited, only its parent's wait is
missing), which belong to a session, and ending a whole session."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import NamedTuple


class Proc(NamedTuple):
    pid: int
    command: str  # the command line, arguments joined by spaces


def _stat(pid: int | str) -> list[str] | None:
    """The fields after the parenthesised command name: state ppid pgrp session ..."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def session_processes(sid: int) -> list[Proc]:
    """Every live (not zombie) process whose session id is `sid`: a server started in its own
    session (start_new_session) and everything it started, wherever they were reparented."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat(entry)
        if fields is None or fields[0] == "Z" or int(fields[3]) != sid:
            continue
        try:
            command = (
                Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            )
        except OSError:
            continue
        found.append(Proc(int(entry), command.strip()))
    return found


def end_session(sid: int, grace_s: float = 0.5, limit_s: float = 5.0) -> None:
    """SIGTERM whatever is left of session `sid`, SIGKILL what outlives `grace_s`, and wait
    (up to `limit_s`) until none of it is alive."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, limit_s)):
        left = session_processes(sid)
        for proc in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
        deadline = time.monotonic() + wait_s
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = session_processes(sid)
        if not left:
            return


def descendants(root: int) -> dict[int, str]:
    """pid -> start time (clock ticks since boot) of every process below `root`, zombies
    included: a pid with the same start time later is the same process."""
    parents: dict[int, int] = {}
    started: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(entry)) is not None:
            parents[int(entry)] = int(fields[1])
            started[int(entry)] = fields[19]  # starttime, field 22 of proc(5)
    below: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in below:
                below[pid] = started[pid]
                frontier.append(pid)
    return below


def still_there(pid: int, started: str) -> str | None:
    """The process's state letter if it still exists (Z: a zombie nobody reaped), else None."""
    fields = _stat(pid)
    return fields[0] if fields is not None and fields[19] == started else None


FORK_SERVER_MARK = "from multiprocessing.forkserver import main"


def fork_server(server_pid: int) -> int | None:
    """The pid of the multiprocessing fork server that `server_pid` started (its ranks'
    parent), if one is alive."""
    for pid in descendants(server_pid):
        fields = _stat(pid)
        if fields is None or fields[0] == "Z" or int(fields[1]) != server_pid:
            continue
        with contextlib.suppress(OSError):
            if FORK_SERVER_MARK in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode():
                return pid
    return None


def zombies(parent: int) -> list[int]:
    """Children of `parent` that exited and that it has not reaped."""
    return [pid for pid in descendants(parent) if (f := _stat(pid)) and f[0] == "Z" and int(f[1]) == parent]


def rss_and_fds(pid: int) -> tuple[int, int]:
    """(resident memory in KiB, open file descriptors) of process `pid`."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def children(parent: int) -> list[int]:
    """The live children of `parent`."""
    return [pid for pid in descendants(parent) if (f := _stat(pid)) and f[0] != "Z" and int(f[1]) == parent]
