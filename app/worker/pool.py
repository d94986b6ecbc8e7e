"""Warm rank processes, forked from a fork server that has already imported torch.

Importing torch and building the first DDP module cost seconds per process; the fork
server pays the import once and each fork then warms up in tens of milliseconds, so a dead
or stuck rank is replaced almost at once. Each process has its own pipe; a reader thread
per process turns its replies (or its death) into messages on the event loop. All pool
state is touched only from the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import multiprocessing
import signal
import threading
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from typing import Any

from app.worker import entry

log = logging.getLogger("batchplan.worker")

PRELOAD = ["app.worker.rank_server"]
# A fork warms up in tens of milliseconds once start() returns (the fork server has done the
# imports by then); one that takes this long is stuck and gets replaced.
WARM_UP_TIMEOUT_S = 15.0
# How long a rank killed by SIGTERM/SIGINT waits before it is replaced (see RankPool._dead).
SHUTDOWN_GRACE_S = 2.0
# The exit code multiprocessing reports for a fork when the fork server that would have
# told its real status is gone (popen_forkserver.Popen.poll).
FORK_SERVER_GONE = 255


class RankDied(RuntimeError):
    def __init__(self, message: str, by_shutdown_signal: bool = False) -> None:
        super().__init__(message)
        # Killed by SIGTERM/SIGINT: most likely the whole process group is being stopped.
        self.by_shutdown_signal = by_shutdown_signal


class RankError(RuntimeError):
    pass


@functools.cache
def _fork_context() -> ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


class RankProcess:
    def __init__(self, process: BaseProcess, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        self.process = process
        self.conn = conn
        self.loop = loop
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.info: dict[str, Any] = {}
        self.ready = False
        self.busy = False
        self.dead = False
        self.on_ready: list[Any] = []
        self.on_death: list[Any] = []
        self.on_models: list[Any] = []

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def start_reader(self) -> None:
        threading.Thread(target=self._read, daemon=True, name=f"rank-reader-{self.pid}").start()

    def _read(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                with contextlib.suppress(RuntimeError):  # the loop may already be closed
                    self.loop.call_soon_threadsafe(self._died)
                return
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._deliver, msg)

    def _deliver(self, msg: dict[str, Any]) -> None:
        if msg.get("op") == "ready" and not self.ready:
            self.info = msg
            self.ready = True
            for callback in self.on_ready:
                callback(self)
            return
        if msg.get("op") == "models":
            for callback in self.on_models:
                callback(msg["models"])
            return
        self.inbox.put_nowait(msg)

    def _died(self) -> None:
        if self.dead:
            return
        self.dead = True
        self.inbox.put_nowait({"op": "dead"})
        for callback in self.on_death:
            callback(self)

    async def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self.dead:
            raise RankDied(self.describe_death(), self.killed_by_shutdown_signal())
        await asyncio.to_thread(self.conn.send, msg)
        reply = await self.inbox.get()
        if reply["op"] == "dead":
            raise RankDied(self.describe_death(), self.killed_by_shutdown_signal())
        if reply["op"] == "error":
            raise RankError(str(reply["error"]))
        return reply

    def describe_death(self) -> str:
        self.process.join(timeout=0.5)
        code = self.process.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return f"rank process {self.pid} {how}"

    def killed_by_shutdown_signal(self) -> bool:
        """Ended by SIGTERM/SIGINT, or with its status lost because the fork server (which
        reports it) died first: what a signal to the whole process group looks like."""
        code = self.process.exitcode
        return code is not None and (-code in (signal.SIGTERM, signal.SIGINT) or code == FORK_SERVER_GONE)

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


class RankPool:
    def __init__(self, size: int, models: dict[str, str] | None = None) -> None:
        self.size = size
        # Registered check models: one rank builds each to describe it (models_info).
        self.models = dict(models or {})
        self.models_info: dict[str, dict[str, Any]] = {}
        self._describing = False
        self.processes: list[RankProcess] = []
        self.stopping = False
        self.changed = asyncio.Condition()
        self.host_info: dict[str, Any] = {}
        self.spawn_error: str | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._starting: set[BaseProcess] = set()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        for _ in range(self.size):
            self._spawn_soon()

    def _spawn_soon(self, delay: float = 0.0) -> None:
        # A fresh context: a replacement is not part of the check (job id) that asked for it.
        task = asyncio.get_running_loop().create_task(self._spawn(delay), context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _spawn(self, delay: float = 0.0) -> None:
        if delay:
            await asyncio.sleep(delay)
        if self.stopping:
            return
        loop = asyncio.get_running_loop()
        ctx = _fork_context()
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        describe = self.models if self.models and not self.models_info and not self._describing else None
        self._describing = self._describing or describe is not None
        process = ctx.Process(
            target=entry.serve, args=(child_conn, describe), daemon=True, name="batchplan-rank"
        )
        # The first start launches the fork server and waits for its imports: seconds. It
        # runs in a thread that a cancelled task cannot stop, so its process is tracked here
        # and ended by stop() even when the task that asked for it is gone.
        starting = asyncio.ensure_future(asyncio.to_thread(process.start))
        self._starting.add(process)
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            await asyncio.wait([starting])
            with contextlib.suppress(Exception):
                process.kill()
            raise
        except Exception as err:
            self.spawn_error = f"could not start a rank process: {err}"
            log.exception("rank process start failed")
            return
        finally:
            self._starting.discard(process)
            child_conn.close()
        rank = RankProcess(process, parent_conn, loop)
        rank.on_ready.append(self._ready)
        rank.on_death.append(self._dead)
        if describe is not None:
            rank.on_models.append(self._described)
            rank.on_death.append(self._describer_died)
        if self.stopping:
            rank.kill()
            return
        self.processes.append(rank)
        rank.start_reader()
        await asyncio.sleep(WARM_UP_TIMEOUT_S)
        if not rank.ready and not rank.dead and rank in self.processes and not self.stopping:
            log.warning(
                "rank process %s did not warm up within %s s; replacing it", rank.pid, WARM_UP_TIMEOUT_S
            )
            self._remove(rank)
            self._spawn_soon()

    def _ready(self, rank: RankProcess) -> None:
        self.host_info = {k: v for k, v in rank.info.items() if k not in ("op", "pid")}
        self._notify()

    def _described(self, info: dict[str, dict[str, Any]]) -> None:
        self.models_info = info
        self._describing = False
        self._notify()

    def _describer_died(self, rank: RankProcess) -> None:
        if not self.models_info:
            self._describing = False  # the next spawn describes them

    def _dead(self, rank: RankProcess) -> None:
        if rank in self.processes and not rank.busy:
            # Died while idle: replace it now. A busy one is replaced when its check releases it.
            self._remove(rank)
            if not self.stopping:
                death = rank.describe_death()
                log.warning("idle %s; replacing it", death)
                # A SIGTERM or SIGINT usually reached the whole process group (Ctrl-C, a
                # container stop): the server itself is about to shut down, and a rank
                # forked now would outlive it. Replace it only if the server stays up.
                self._spawn_soon(delay=SHUTDOWN_GRACE_S if rank.killed_by_shutdown_signal() else 0.0)
        self._notify()

    def _remove(self, rank: RankProcess) -> None:
        if rank in self.processes:
            self.processes.remove(rank)
        rank.kill()
        rank.close()

    def _notify(self) -> None:
        async def notify() -> None:
            async with self.changed:
                self.changed.notify_all()

        task = asyncio.get_running_loop().create_task(notify(), context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        self.stopping = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        # Each cancelled spawn ends the process it was starting before it finishes.
        await asyncio.gather(*tasks, return_exceptions=True)
        for process in list(self._starting):
            with contextlib.suppress(Exception):
                process.kill()
        ranks = list(self.processes)
        for rank in ranks:
            with contextlib.suppress(Exception):
                rank.conn.send({"op": "exit"})
        await asyncio.to_thread(self._reap, ranks)
        self.processes.clear()

    @staticmethod
    def _reap(ranks: list[RankProcess]) -> None:
        for rank in ranks:
            rank.process.join(timeout=1.0)
            if rank.process.is_alive():
                rank.kill()
                rank.process.join(timeout=2.0)
            rank.close()

    # ------------------------------------------------------------------ use

    def warm(self) -> list[RankProcess]:
        return [r for r in self.processes if r.ready and not r.dead]

    def idle(self) -> list[RankProcess]:
        return [r for r in self.warm() if not r.busy]

    async def acquire(self, count: int) -> list[RankProcess]:
        """`count` warm idle processes, all at once so that two checks never deadlock
        holding half each. Callers bound the wait with their own timeout."""
        count = min(count, self.size)
        async with self.changed:
            while len(self.idle()) < count:
                if self.stopping:
                    raise RuntimeError("the worker is shutting down")
                await self.changed.wait()
            ranks = self.idle()[:count]
            for rank in ranks:
                rank.busy = True
            return ranks

    def release(self, ranks: list[RankProcess], healthy: bool) -> None:
        """Healthy ranks go back to the pool; after a failure, timeout or cancel every rank
        of the check is killed (some may be stuck in a collective) and replaced."""
        for rank in ranks:
            rank.busy = False
            if healthy and not rank.dead:
                continue
            self._remove(rank)
            if not self.stopping:
                # As in _dead: a rank that a SIGTERM/SIGINT ended waits out the grace.
                self._spawn_soon(delay=SHUTDOWN_GRACE_S if rank.killed_by_shutdown_signal() else 0.0)
        self._notify()

    def describe(self) -> list[dict[str, Any]]:
        return [
            {
                "pid": r.pid,
                "state": "dead" if r.dead else "busy" if r.busy else "idle" if r.ready else "warming",
            }
            for r in self.processes
        ]
