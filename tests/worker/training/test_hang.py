"""hang.hangs on real gloo processes: a step whose ranks run unequal all-reduces times out on
the throwaway group instead of hanging, every rank hears it, and the ranks' own group serves
the next collective (and the next hangs) as before."""

from __future__ import annotations

import multiprocessing
from multiprocessing.queues import Queue
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from app.ports import free_port
from app.worker.training.hang import hangs

WORLD = 2


def _unequal(group: ProcessGroup) -> None:
    """The mistaken loop: rank 0 has one more micro-batch, and all-reduces it alone."""
    for _ in range(3 if dist.get_rank() == 0 else 2):
        dist.all_reduce(torch.ones(4), group=group)


def _equal(group: ProcessGroup) -> None:
    for _ in range(2):
        dist.all_reduce(torch.ones(4), group=group)


def _rank(rank: int, port: int, out: Queue[Any]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    seen = [hangs(_unequal, 0.5), hangs(_equal, 0.5), hangs(_unequal, 0.5)]
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)  # the ranks' own group, after two timeouts on throwaway ones
    out.put((rank, seen, total.item()))
    dist.destroy_process_group()


@pytest.mark.slow  # two gloo processes and two 0.5 s timeouts: ~2 s
def test_a_hung_collective_is_detected_and_the_ranks_own_group_goes_on() -> None:
    context = multiprocessing.get_context("fork")  # the ranks inherit torch, imported once here
    out: Queue[Any] = context.Queue()
    port = free_port()
    ranks = [context.Process(target=_rank, args=(r, port, out)) for r in range(WORLD)]
    for process in ranks:
        process.start()
    answers = sorted(out.get(timeout=120) for _ in ranks)
    for process in ranks:
        process.join(30)
    assert [p.exitcode for p in ranks] == [0] * WORLD
    assert answers == [(r, [True, False, True], 3.0) for r in range(WORLD)]
