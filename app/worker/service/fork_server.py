"""The multiprocessing fork server the rank processes come from, and its orderly end.

The fork server (and the resource tracker that multiprocessing starts with it) are this
process's children, the ranks are the fork server's. A server that exits before they do
leaves them to whoever adopts orphans, which in a container may never reap them: so the
pool ends the ranks first (the fork server reaps those), then these two, and reaps them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from typing import Any

from app.contract.targets import resolve

log = logging.getLogger("batchplan.worker")

# The rank server, named and never imported here: the web process does not import torch. The
# fork server imports it once (preload); each fork then calls its `serve`.
RANK_SERVER = "app.worker.rank.rank_server"
PRELOAD = [RANK_SERVER]

# How the fork servers this process started and collected ended: pid -> exit code (negative:
# the signal). A rank that died with its fork server has no status of its own (it reads 255),
# so this is how its death is told: killed on its own, or in a shutdown. The last few only.
_deaths: dict[int, int] = {}
_DEATHS_KEPT = 16

# The pools of this process that fork ranks (one in a server; tests run several apps at
# once): the fork server is shared, and ends when the last of them stops.
_users: set[int] = set()
_users_lock = threading.Lock()


def use_fork_server(user: object) -> None:
    with _users_lock:
        _users.add(id(user))


@functools.cache
def fork_context() -> ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def serve_rank(conn: Connection, describe: dict[str, str] | None = None) -> None:
    """What a forked rank process runs (a torch-free target the web process can name): the
    rank server, already imported by the fork server."""
    resolve(f"{RANK_SERVER}:serve")(conn, describe)


def current_pid() -> int | None:
    """The pid of this process's fork server, if it started one."""
    from multiprocessing import forkserver

    pid: int | None = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return pid


def death_of(pid: int | None) -> int | None:
    """How fork server `pid` ended (exit code, negative for a signal), if it was collected."""
    return _deaths.get(pid) if pid is not None else None


def how_it_ended(code: int | None) -> str:
    """A process's exit code (negative: the signal) in words."""
    return f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"


def reap_if_dead() -> tuple[int, str] | None:
    """If this process's fork server has exited, collect it (it stays a zombie otherwise) and
    forget it, so that the next fork starts a fresh one: (its pid, how it ended); None while
    it runs or when there is none. multiprocessing would notice only at the next fork and
    would drop the status, which tells whether a shutdown or a stray kill ended its ranks."""
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver
    with server._lock:
        pid = server._forkserver_pid
        if pid is None:
            return None
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, -1  # collected elsewhere: gone, status unknown
        if done != pid:
            return None
        _forget(server)
    code = os.waitstatus_to_exitcode(status) if status != -1 else FORK_SERVER_STATUS_UNKNOWN
    _deaths[pid] = code
    while len(_deaths) > _DEATHS_KEPT:
        del _deaths[next(iter(_deaths))]
    # A shutdown's signal to the whole process group ends it too: that one is no news.
    level = logging.INFO if -code in (signal.SIGTERM, signal.SIGINT) else logging.WARNING
    log.log(level, "the fork server (pid %s) %s; the next rank starts a fresh one", pid, how_it_ended(code))
    return pid, how_it_ended(code)


# What death_of() says for a fork server that was collected without its status.
FORK_SERVER_STATUS_UNKNOWN = 255


def _forget(server: Any) -> None:
    """Drop multiprocessing's handles on a fork server that is gone (under its lock)."""
    if server._forkserver_alive_fd is not None:
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)
    server._forkserver_alive_fd = None
    server._forkserver_pid = None
    address = server._forkserver_address
    server._forkserver_address = None
    if isinstance(address, str) and not address.startswith("\0"):
        with contextlib.suppress(OSError):
            os.unlink(address)


def kill_for(user: object) -> None:
    """SIGKILL the fork server if `user` is its only user: a stop that finds starts waiting
    for its imports (seconds) ends them at once; stop_fork_server then reaps it."""
    with _users_lock:
        if _users - {id(user)}:
            return
    pid = current_pid()
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _reap(pid: int, timeout_s: float) -> None:
    """Wait for child `pid` to exit (SIGKILL after `timeout_s`) and collect its status."""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
            time.sleep(0.01)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # already reaped


def stop_fork_server(user: object, timeout_s: float = 2.0) -> None:
    """`user` is done with the fork server: if no other user is left, end it and its
    resource tracker, if this process started them, and reap both (blocking: call it from a
    thread, once the ranks are gone). A later fork starts fresh ones. Private
    multiprocessing state: there is no public way to stop either, and `ForkServer._stop`
    waits without a limit."""
    from multiprocessing import forkserver, resource_tracker

    with _users_lock:
        _users.discard(id(user))
        if _users:
            return

    server: Any = forkserver._forkserver
    with server._lock:
        pid = server._forkserver_pid
        # None: never started, or it died and was collected (reap_if_dead); the resource
        # tracker may still run either way.
        if pid is not None:
            # End of file on its "alive" pipe tells the fork server to exit; the ranks have
            # let go of their ends (rank_server._exit_with_parent) or are gone.
            with contextlib.suppress(OSError):
                os.close(server._forkserver_alive_fd)
            server._forkserver_alive_fd = None
            _reap(pid, timeout_s)
            _forget(server)
    tracker: Any = resource_tracker._resource_tracker
    with tracker._lock:
        if tracker._fd is None or tracker._pid is None:
            return
        with contextlib.suppress(OSError):
            os.close(tracker._fd)  # end of file: it exits
        tracker._fd = None
        _reap(tracker._pid, timeout_s)
        tracker._pid = None
