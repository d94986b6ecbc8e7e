"""A collective that hangs, detected: a control whose mistake leaves some ranks waiting for peers
that never come (unequal micro-batch counts without an end-of-epoch policy, an all-reduce per
micro-batch on unequal counts) is run on a throwaway gloo group with a short timeout, so the wait
ends in gloo's timeout error instead of a hang, and the check's own group and its warm ranks go
on to the next check unharmed."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

# A rank on a 2-core host needs well under a second to reach the collective: 2 s separates a
# hang from a slow peer.
HANG_TIMEOUT_S = 2.0


def hangs(step: Callable[[ProcessGroup], None], timeout_s: float) -> bool:
    """Run `step(group)` on every rank of the check against a throwaway gloo group made for it
    (dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s)), every rank calls
    new_group), where `step` does the control's collectives as the mistaken loop would (so some
    ranks wait for peers that never come). A rank whose collective times out has hung. Then
    every rank meets on the check's own group (a barrier that the hung ranks reach once their
    timeout fires), the throwaway group is destroyed on every rank, and the hung flags are
    all-reduced (MAX) on the check's group: True on every rank when any rank hung. The check's
    own group, and the warm ranks, are unharmed: the next check runs on them (a test shows it)."""
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    hung = False
    try:
        step(group)
    except RuntimeError as err:  # gloo's DistBackendError is one
        if "timed out" not in str(err).lower() and "timeout" not in str(err).lower():
            raise
        hung = True
    # Every rank leaves the throwaway group only once every peer has stopped using it: a rank
    # that ran dry waits here while the others' collectives time out.
    dist.barrier()
    dist.destroy_process_group(group)
    flag = torch.tensor([1 if hung else 0], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())
