"""One warm rank process as the pool sees it: its pipe, its reader thread, its state.

The reader thread turns the rank's replies (or its death) into messages on the event loop;
everything else here runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TypeVar

from app.contract import protocol
from app.contract.host import BuiltModel
from app.worker.service import fork_server
from app.worker.service.runner import RankDied, RankError

# The exit code multiprocessing reports for a fork when the fork server that would have
# told its real status is gone (popen_forkserver.Popen.poll).
FORK_SERVER_GONE = 255

Reply = TypeVar("Reply", bound=protocol.FromRank)


@dataclass(frozen=True, slots=True)
class _Dead:
    """Put in the inbox when the pipe closes: not a message the rank sends."""


class RankProcess:
    def __init__(self, process: BaseProcess, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        self.process = process
        self._pid = process.pid
        self._exitcode: int | None = None  # kept when the process object is closed (buried)
        self._buried = False
        self.conn = conn
        self.loop = loop
        self.inbox: asyncio.Queue[protocol.FromRank | _Dead] = asyncio.Queue()
        self.info: protocol.Ready | None = None
        self.busy = False
        self.dead = False
        self.on_ready: list[Callable[[RankProcess], None]] = []
        self.on_death: list[Callable[[RankProcess], None]] = []
        self.on_models: list[Callable[[dict[str, BuiltModel]], None]] = []
        # The fork server it came from: a rank that dies with it has no status of its own.
        self.fork_server_pid = fork_server.current_pid()
        self.attempt = 0  # its failed starts in a row before it (the pool's retry count)
        # The process group it keeps from its last check (check_ranks._kept_group): the
        # group's name, size, backend and timeout, and this rank's place in it.
        self.group: tuple[str, int, str, float] | None = None
        self.group_rank = -1

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def exitcode(self) -> int | None:
        return self._exitcode if self._buried else self.process.exitcode

    @property
    def ready(self) -> bool:
        return self.info is not None

    def start_reader(self) -> None:
        threading.Thread(target=self._read, daemon=True, name=f"rank-reader-{self.pid}").start()

    def _read(self) -> None:
        while True:
            try:
                raw = self.conn.recv_bytes()
            except (EOFError, OSError):
                with contextlib.suppress(RuntimeError):  # the loop may already be closed
                    self.loop.call_soon_threadsafe(self._died)
                return
            try:
                msg: protocol.Message = protocol.from_pipe(raw)
            except (ValueError, TypeError, KeyError) as err:
                msg = protocol.Error(f"rank process {self.pid} sent an unreadable message: {err}")
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._deliver, msg)

    def _deliver(self, msg: protocol.Message) -> None:
        if isinstance(msg, protocol.Ready):
            if not self.ready:
                self.info = msg
                for callback in self.on_ready:
                    callback(self)
            return
        if isinstance(msg, protocol.Models):
            for describe in self.on_models:
                describe(msg.models)
            return
        if isinstance(msg, protocol.Joined | protocol.Done | protocol.Result | protocol.Error):
            self.inbox.put_nowait(msg)

    def _died(self) -> None:
        if self.dead:
            return
        self.dead = True
        self.inbox.put_nowait(_Dead())
        for callback in self.on_death:
            callback(self)

    async def request(self, msg: protocol.ToRank, expect: type[Reply]) -> Reply:
        """Send `msg` and wait for the reply, which must be an `expect`."""
        if self.dead:
            raise RankDied(self.describe_death(), self.killed_by_shutdown_signal())
        try:
            await asyncio.to_thread(self._send, msg)
        except OSError:
            # It died before its reader saw the pipe close (a broken pipe, or a reset): the
            # same death, said the same way, not an internal error of the check.
            self._died()
            raise RankDied(self.describe_death(), self.killed_by_shutdown_signal()) from None
        reply = await self.inbox.get()
        if isinstance(reply, _Dead):
            raise RankDied(self.describe_death(), self.killed_by_shutdown_signal())
        if isinstance(reply, protocol.Error):
            raise RankError(reply.error, reply.traceback, reply.model_raised, reply.group_lost)
        if not isinstance(reply, expect):
            raise RankError(f"rank process {self.pid} answered {reply.op!r} to {msg.op!r}")
        return reply

    def _send(self, msg: protocol.ToRank) -> None:
        """The message as the codec's bytes on the pipe, written in a worker thread: off the event
        loop, as the reader thread reads the replies."""
        self.conn.send_bytes(protocol.to_pipe(msg))

    def send_exit(self) -> None:
        with contextlib.suppress(Exception):
            self._send(protocol.Exit())

    def describe_death(self) -> str:
        if not self._buried:
            self.process.join(timeout=0.5)
        code = self.exitcode
        if code == FORK_SERVER_GONE:
            fork_server.reap_if_dead()
            ended = fork_server.death_of(self.fork_server_pid)
            if ended is not None and ended != fork_server.FORK_SERVER_STATUS_UNKNOWN:
                server = f"its fork server (pid {self.fork_server_pid})"
                return f"rank process {self.pid} died with {server}, which {fork_server.how_it_ended(ended)}"
        return f"rank process {self.pid} {fork_server.how_it_ended(code)}"

    def killed_by_shutdown_signal(self) -> bool:
        """Ended by SIGTERM/SIGINT, or with its fork server (which reports its status) when a
        SIGTERM/SIGINT ended that, or when how it ended is unknown: what a signal to the whole
        process group looks like."""
        code = self.exitcode
        if code == FORK_SERVER_GONE:
            fork_server.reap_if_dead()
            ended = fork_server.death_of(self.fork_server_pid)
            code = FORK_SERVER_GONE if ended is None else ended
        return code is not None and (-code in (signal.SIGTERM, signal.SIGINT) or code == FORK_SERVER_GONE)

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()

    async def bury(self) -> None:
        """Once the (killed) process has exited, free what the process object holds: two
        descriptors of the fork server's status pipe, otherwise kept until the garbage
        collector finds it, one pair per replaced rank."""
        await asyncio.to_thread(self.process.join, 10.0)
        if not self._buried and self.process.exitcode is not None:
            self._exitcode = self.process.exitcode
            self._buried = True
            with contextlib.suppress(ValueError):
                self.process.close()


def reap(ranks: list[RankProcess], killed: list[BaseProcess]) -> None:
    """Wait for ranks sent Exit (SIGKILL those that linger) and for processes killed before
    they joined the pool, so that none is left a zombie (blocking: run it in a thread)."""
    for rank in ranks:
        if rank._buried:
            continue  # joined and closed already
        rank.process.join(timeout=1.0)
        if rank.process.is_alive():
            rank.kill()
            rank.process.join(timeout=2.0)
        rank.close()
    for process in killed:
        with contextlib.suppress(Exception):  # one that never started has nothing to join
            process.join(timeout=2.0)
