"""A gloo process group of one rank in this process, on CPU: what the tests that run a check's
rank side here (not on warm ranks) stand on. An in-memory store, so no port is taken; the
group is destroyed on the way out, so that the next test can make its own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import HashStore

from app.worker.checks.result_parts import CheckGroup


@contextlib.contextmanager
def one_rank_group() -> Iterator[CheckGroup]:
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        yield CheckGroup(0, 1, torch.device("cpu"), "gloo")
    finally:
        dist.destroy_process_group()
