"""The pool's view of one rank process, on a real process and a real pipe."""

from __future__ import annotations

import asyncio
import multiprocessing

import pytest

from app.contract import protocol
from app.worker.service.rank_process import RankProcess
from app.worker.service.runner import RankDied


def _exit_at_once() -> None:
    pass


def test_a_rank_that_died_before_its_reader_noticed_is_a_death_not_a_broken_pipe() -> None:
    # Found by the soak: a request sent to a rank whose pipe had just closed surfaced as
    # "internal error: BrokenPipeError" instead of the rank's death.
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    process = context.Process(target=_exit_at_once)
    process.start()
    process.join(timeout=30)
    theirs.close()  # with the child gone, nobody reads the other end any more

    async def ask() -> None:
        rank = RankProcess(process, ours, asyncio.get_running_loop())  # no reader started
        deaths: list[RankProcess] = []
        rank.on_death.append(deaths.append)
        with pytest.raises(RankDied, match=f"rank process {process.pid}"):
            await rank.request(protocol.Exit(), protocol.Done)
        assert rank.dead and deaths == [rank]  # the pool hears of it and replaces it

    asyncio.run(ask())
