"""The multiprocessing fork server the rank processes come from, and its orderly end.

The fork server (and the resource tracker that multiprocessing starts with it) are this
process's children, the ranks are the fork server's. A server that exits before they do
leaves them to whoever adopts orphans, which in a container may never reap them: so the
pool ends the ranks first (the fork server reaps those), then these two, and reaps them.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from typing import Any

from app.worker.contract.targets import resolve

# The rank server, named and never imported here: the web process does not import torch. The
# fork server imports it once (preload); each fork then calls its `serve`.
RANK_SERVER = "app.worker.rank.rank_server"
PRELOAD = [RANK_SERVER]

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
        if pid is None:
            return
        # End of file on its "alive" pipe tells the fork server to exit; the ranks have
        # let go of their ends (rank_server._exit_with_parent) or are gone.
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
        _reap(pid, timeout_s)
        server._forkserver_pid = None
        address = server._forkserver_address
        server._forkserver_address = None
        if isinstance(address, str) and not address.startswith("\0"):
            with contextlib.suppress(OSError):
                os.unlink(address)
    tracker: Any = resource_tracker._resource_tracker
    with tracker._lock:
        if tracker._fd is None or tracker._pid is None:
            return
        with contextlib.suppress(OSError):
            os.close(tracker._fd)  # end of file: it exits
        tracker._fd = None
        _reap(tracker._pid, timeout_s)
        tracker._pid = None
