"""Warm rank processes, forked from a fork server that has already imported torch: the
check runner of a worker (runner.CheckRunner).

Importing torch and building the first DDP module cost seconds per process; the fork
server pays the import once and each fork then warms up in tens of milliseconds, so a dead
or stuck rank is replaced almost at once. Each process has its own pipe (rank_process).
All pool state is touched only from the event loop.

Over 300 lines: one concept, the pool's processes from their start to their end, and the
lanes' share of them (a long check leaves a rank to the short ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Coroutine
from multiprocessing.process import BaseProcess
from typing import Any

from app.contract import protocol
from app.contract.check_result import CheckResult
from app.contract.host import BuiltModel, ProcessDescription
from app.worker.service import fork_server
from app.worker.service.check_ranks import backend_for, ranks_for, run_on_ranks
from app.worker.service.fork_server import fork_context, serve_rank, stop_fork_server, use_fork_server
from app.worker.service.rank_process import RankProcess, reap
from app.worker.service.runner import SHUTDOWN_GRACE_S, CheckOrder, RankError, RanksUnavailable
from app.worker.service.start_backoff import failing, retry_after, warm_up_patience

log = logging.getLogger("batchplan.worker")


class RankPool:
    def __init__(self, size: int, models: dict[str, str] | None = None) -> None:
        self.size = size
        # Registered check models: one rank builds each to describe it (models_info).
        self.models = dict(models or {})
        self.models_info: dict[str, BuiltModel] = {}
        self._describing = False
        self.processes: list[RankProcess] = []
        self.stopping = False
        self.changed = asyncio.Condition()
        self.host_info = protocol.HostInfo()  # empty until the first rank is warm
        self.spawn_error: str | None = None  # why the last start failed, until a rank is warm
        self.failing: str | None = None  # set while starts keep failing: why checks cannot run
        self._tasks: set[asyncio.Task[None]] = set()
        self._starting: set[BaseProcess] = set()
        self._long_holding = 0  # ranks a long check (its own lane) holds now
        # Killed before they joined the pool: stop() waits for these too.
        self._ended: list[BaseProcess] = []

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        use_fork_server(self)
        for _ in range(self.size):
            self._spawn_soon()

    def _spawn_soon(self, delay: float = 0.0, attempt: int = 0) -> None:
        # A fresh context: a replacement is not part of the check (job id) that asked for it.
        self._soon(self._spawn(delay, attempt))

    async def _spawn(self, delay: float = 0.0, attempt: int = 0) -> None:
        if delay:
            await asyncio.sleep(delay)
        if self.stopping:
            return
        fork_server.reap_if_dead()  # a zombie otherwise; the next start makes a fresh one
        loop = asyncio.get_running_loop()
        ctx = fork_context()
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        describe = self.models if self.models and not self.models_info and not self._describing else None
        self._describing = self._describing or describe is not None
        process = ctx.Process(
            target=serve_rank, args=(child_conn, describe), daemon=True, name="batchplan-rank"
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
            if not starting.cancelled():
                starting.exception()  # a start the stop cut short failed: retrieved, not logged
            with contextlib.suppress(Exception):
                process.kill()
            self._ended.append(process)
            raise
        except Exception as err:
            if describe is not None:
                self._describing = False  # the next start describes them
            self._start_failed(f"could not start a rank process: {type(err).__name__}: {err}", attempt)
            return
        finally:
            self._starting.discard(process)
            child_conn.close()
        rank = RankProcess(process, parent_conn, loop)
        rank.attempt = attempt
        rank.on_ready.append(self._ready)
        rank.on_death.append(self._dead)
        if describe is not None:
            rank.on_models.append(self._described)
            rank.on_death.append(self._describer_died)
        if self.stopping:
            rank.kill()
            self._ended.append(process)
            return
        self.processes.append(rank)
        rank.start_reader()
        patience = warm_up_patience(attempt)
        await asyncio.sleep(patience)
        if not rank.ready and not rank.dead and rank in self.processes and not self.stopping:
            self._remove(rank)
            self._start_failed(f"rank process {rank.pid} did not warm up within {patience:g} s", attempt)

    def _start_failed(self, reason: str, attempt: int, at_least: float = 0.0) -> None:
        """A start failed: say why, try again after a back-off, and call the pool failing once
        starts keep failing with no rank warm."""
        if self.stopping:
            return
        self.spawn_error = reason
        retry = max(retry_after(attempt), at_least)
        log.warning("%s; trying again in %g s", reason, retry)
        if failing(attempt) and not self.warm():
            self.failing = (
                f"rank processes keep failing to start ({attempt + 1} tries in a row); the last: {reason}"
            )
        self._spawn_soon(delay=retry, attempt=attempt + 1)
        self._notify()

    def _ready(self, rank: RankProcess) -> None:
        if rank.info is not None:
            self.host_info = rank.info.host
        self.spawn_error = self.failing = None
        self._notify()

    def _described(self, info: dict[str, BuiltModel]) -> None:
        self.models_info = info
        for name, model in info.items():  # start-up cannot know this: the operator reads it here
            if not model.loaded:
                log.error("check model %r cannot be built; its checks are refused: %s", name, model.error)
        self._describing = False
        self._notify()

    def _describer_died(self, rank: RankProcess) -> None:
        if not self.models_info:
            self._describing = False  # the next spawn describes them

    def _dead(self, rank: RankProcess) -> None:
        fork_server.reap_if_dead()  # a zombie otherwise; the next start makes a fresh one
        if rank in self.processes and not rank.busy:
            # Died while idle: replace it now. A busy one is replaced when its check releases it.
            self._remove(rank)
            if self.stopping:
                pass
            elif not rank.ready:
                death = f"{rank.describe_death()} before it was warm"
                self._start_failed(death, rank.attempt, self._replace_after(rank))
            else:
                log.warning("idle %s; replacing it", rank.describe_death())
                self._spawn_soon(delay=self._replace_after(rank))
        self._notify()

    @staticmethod
    def _replace_after(rank: RankProcess) -> float:
        """A SIGTERM/SIGINT usually reached the whole process group (Ctrl-C, a container stop):
        the server is about to stop, and a rank forked now would outlive it."""
        return SHUTDOWN_GRACE_S if rank.killed_by_shutdown_signal() else 0.0

    def _remove(self, rank: RankProcess) -> None:
        if rank in self.processes:
            self.processes.remove(rank)
        rank.kill()
        rank.close()
        if not self.stopping:  # stop() reaps every rank itself
            self._soon(rank.bury())

    def _notify(self) -> None:
        async def notify() -> None:
            async with self.changed:
                self.changed.notify_all()

        self._soon(notify())

    def _soon(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in the background, outside any check's context; stop() cancels it."""
        task = asyncio.get_running_loop().create_task(work, context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def begin_stop(self) -> None:
        """Start no more rank processes (a shutdown has begun)."""
        self.stopping = True

    async def stop(self) -> None:
        """End every rank process, then the fork server, and reap them all: nothing of the
        pool outlives it, not even as a zombie."""
        self.stopping = True
        if self._starting:
            fork_server.kill_for(self)  # rather than wait for its imports to end each start
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        # Each cancelled spawn ends the process it was starting before it finishes.
        await asyncio.gather(*tasks, return_exceptions=True)
        for process in list(self._starting):
            with contextlib.suppress(Exception):
                process.kill()
            self._ended.append(process)
        ranks = list(self.processes)
        for rank in ranks:
            rank.send_exit()
        await asyncio.to_thread(reap, ranks, list(self._ended))
        self.processes.clear()
        self._ended.clear()
        # Last: the fork server reports (and reaps) the ranks until they are gone.
        await asyncio.to_thread(stop_fork_server, self)

    # ------------------------------------------------------------------ use

    def warm(self) -> list[RankProcess]:
        return [r for r in self.processes if r.ready and not r.dead]

    def idle(self) -> list[RankProcess]:
        return [r for r in self.warm() if not r.busy]

    def lane_cap(self, long: bool) -> int:
        """The most ranks a check of that lane takes now: a long check leaves one for the
        short lane; a short check takes what no long check holds (its replicas then share
        fewer ranks, which changes its cost, not its answer)."""
        if long:
            return max(1, self.size - 1)
        return max(1, self.size - self._long_holding)

    async def acquire(self, count: int, *, long: bool = False, fewer: bool = False) -> list[RankProcess]:
        """`count` warm idle processes, all at once so that two checks never deadlock
        holding half each; with `fewer`, no more than the lane may take at the moment it
        gets them. Callers bound the wait with their own timeout."""
        async with self.changed:
            while True:
                want = min(count, self.size, self.lane_cap(long)) if fewer else min(count, self.size)
                if len(self.idle()) >= want:
                    break
                if self.stopping:
                    raise RuntimeError("the worker is shutting down")
                if self.failing is not None and not self.warm():
                    raise RanksUnavailable(self.failing)
                await self.changed.wait()
            ranks = self.idle()[:want]
            for rank in ranks:
                rank.busy = True
            if long:
                self._long_holding += len(ranks)
            return ranks

    def release(self, ranks: list[RankProcess], healthy: bool, *, long: bool = False) -> None:
        """Healthy ranks go back to the pool; after a failure, timeout or cancel every rank
        of the check is killed (some may be stuck in a collective) and replaced."""
        if long:
            self._long_holding -= len(ranks)
        for rank in ranks:
            rank.busy = False
            if healthy and not rank.dead:
                continue
            self._remove(rank)
            if not self.stopping:
                self._spawn_soon(delay=self._replace_after(rank))
        self._notify()

    def describe(self) -> list[ProcessDescription]:
        return [
            ProcessDescription(
                r.pid, "dead" if r.dead else "busy" if r.busy else "idle" if r.ready else "warming"
            )
            for r in self.processes
        ]

    # ------------------------------------------------------------------ checks

    async def run_check(self, order: CheckOrder) -> CheckResult:
        """Run one check on min(replicas, size) warm ranks (one per mesh rank for a mesh).

        A rank that does not hold the kept process group the pool named for the check
        (check_ranks._kept_group) answers at once; its peers may already wait in the check's
        first collective, so every rank of the check is replaced, and the check runs again,
        once, on fresh ranks: the pool's record of a group and a rank's own disagreed (seen
        once in a soak, after faults), and that is the pool's mistake, not the check's."""
        try:
            return await self._run_check(order)
        except RankError as err:
            if not err.group_lost:
                raise
            log.warning("check %s: %s; running it again on fresh ranks", order.job_id, err)
            return await self._run_check(order)

    async def _run_check(self, order: CheckOrder) -> CheckResult:
        wanted, replicas = ranks_for(order.spec, self.size)
        order.progress.waiting_for = wanted
        # A mesh needs a process per mesh rank; replicas run on as many ranks as there are.
        ranks = await self.acquire(wanted, long=order.long, fewer=order.spec.mesh is None)
        order.progress.holding = True
        backend, local = backend_for(order.spec.backend, int(self.host_info.gpus or 0), ranks)
        healthy = False
        try:
            result = await run_on_ranks(local, order, backend=backend, replicas=replicas)
            healthy = True
            return result
        except RankError as err:
            healthy = err.ranks_kept
            raise
        finally:
            self.release(ranks, healthy, long=order.long)
