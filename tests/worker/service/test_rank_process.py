"""The pool's view of one rank process, on a real process and a real pipe: what it sends is the
codec's JSON bytes, nothing pickled on top."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from multiprocessing.connection import Connection

import pytest

from app.contract import protocol
from app.contract.codec import encode
from app.contract.request import build_spec, check_request
from app.worker.service.rank_process import RankProcess
from app.worker.service.runner import RankDied, RankError


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


def _echo_what_came(conn: Connection) -> None:
    """A rank that answers with the bytes it was sent, as an error's text: what the pipe carried."""
    raw = conn.recv_bytes()
    conn.send_bytes(protocol.to_pipe(protocol.Error(raw.decode())))


def test_the_pipe_carries_the_codecs_json_bytes_and_nothing_pickled_on_top() -> None:
    spec = build_spec(
        check_request({"plan": {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 8}})
    )
    run = protocol.Run("127.0.0.1:1", "job", 1, 60.0, spec, 2, "gloo", 2, None, 0, 0, True)
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    process = context.Process(target=_echo_what_came, args=(theirs,))
    process.start()

    async def ask() -> str:
        rank = RankProcess(process, ours, asyncio.get_running_loop())
        rank.start_reader()
        with pytest.raises(RankError) as answered:
            await rank.request(run, protocol.Result)
        return str(answered.value)

    try:
        carried = asyncio.run(ask())
    finally:
        process.join(timeout=30)
    assert json.loads(carried) == encode(run)  # what the rank read: JSON, the codec's values
    assert carried.startswith('{"op":"run",')
    assert protocol.from_pipe(carried.encode()) == run
