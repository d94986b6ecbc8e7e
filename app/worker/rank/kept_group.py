"""The process group a warm rank keeps from one check to the next.

Forming a gloo group of 8 ranks on one host costs 10-30 ms, and tearing it down 20-80 ms on
each rank (gloo takes each peer's socket off its event loop and waits for the loop's next
10 ms tick, one peer after another): more than a small check's own work. Checks that run on
the same ranks in the same order therefore share one group: the pool names it (`Run.group`)
and says when every rank of the check holds it (`Run.reuse`). A check that fails in any way
tears it down, so a group that a failed check may have left mid-collective never carries over.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch._C._distributed_c10d import TCPStore

from app.worker.training import mesh_models


@dataclass(slots=True)
class Kept:
    key: str
    store: TCPStore  # the check's rendezvous store: results travel through it
    serving: bool  # this rank serves the store (the leader)


class GroupLost(RuntimeError):
    """The pool named a kept group this rank does not hold: the check cannot start here, and
    the pool runs it again on fresh ranks (pool.run_check)."""


class KeptGroup:
    """At most one kept group per rank: the default process group, and its store."""

    def __init__(self) -> None:
        self.kept: Kept | None = None

    def take(self, key: str) -> Kept:
        """The kept group the pool said this rank holds."""
        if self.kept is None or self.kept.key != key:
            held = self.kept.key if self.kept else "none"
            self.drop()
            raise GroupLost(f"the pool asked for kept process group {key!r}; this rank holds {held}")
        return self.kept

    def keep(self, key: str, store: TCPStore, serving: bool) -> None:
        self.kept = Kept(key, store, serving)

    def drop(self) -> None:
        """Tear the default group down (with the meshes built on it) and let its store go."""
        self.kept = None
        mesh_models.forget_meshes()
        if dist.is_initialized():
            dist.destroy_process_group()
