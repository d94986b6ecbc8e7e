"""Run a function on forked ranks of a real gloo process group, as the warm ranks do: each
rank forms the group through a TCPStore on a free port, calls `work(rank, world)` and sends
back what it returned (picklable: tensors, numbers, dicts)."""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from app.ports import free_port

TIMEOUT_S = 300


def _rank(rank: int, world: int, port: int, work: Callable[[int, int], Any], out: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import TCPStore

    torch.set_num_threads(1)
    try:
        store = TCPStore("127.0.0.1", port, world, rank == 0, timeout=timedelta(seconds=TIMEOUT_S))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        try:
            answer = work(rank, world)
            dist.barrier()
        finally:
            dist.destroy_process_group()
        out.put((rank, True, answer))
    except BaseException as err:  # the test shows what failed, rather than waiting
        out.put((rank, False, f"{type(err).__name__}: {err}"))
    finally:
        out.close()
        out.join_thread()  # the answer is on the pipe before the process ends
        os._exit(0)  # torch's atexit handlers in a forked child are the parent's business


def on_ranks(world: int, work: Callable[[int, int], Any]) -> list[Any]:
    """`work`'s answer on every rank, in rank order; an error on any rank fails the test."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, work, out)) for r in range(world)]
    for p in procs:
        p.start()
    answers: dict[int, Any] = {}
    try:
        for _ in range(world):
            rank, ok, answer = out.get(timeout=TIMEOUT_S)
            if not ok:
                raise AssertionError(f"rank {rank}: {answer}")
            answers[rank] = answer
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [answers[r] for r in range(world)]
