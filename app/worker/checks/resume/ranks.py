"""The ranks a resume check trains on, before and after the checkpoint: a plan's replicas under
DDP, or on its mesh (FSDP2 / HSDP / TP), each stepping, clipping, and saving and loading the
full state (check.py says why a full state)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.nn.parallel import DistributedDataParallel

from app.contract.mesh_spec import mesh_sizes
from app.contract.spec import replica_range
from app.core.records.plan import LearningRatePlan, Plan
from app.worker.checks.kind import Context
from app.worker.checks.resume.parts import first_ranks, sub_mesh, summed
from app.worker.checks.run.mesh import MeshRank
from app.worker.training.gradients import Batch, BatchFeed, micro_steps
from app.worker.training.mesh_models import build_mesh, synthetic_parallelize
from app.worker.training.reference_run import build_optimizer
from app.worker.training.replica_feed import ReplicaStep
from app.worker.training.token_model import TokenWorkload
from app.worker.training.workload import Registered, Workload

Feeds = Callable[[int], Iterator[ReplicaStep]]  # a replica's steps, by its data-parallel rank
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def run_recipe(ctx: Context) -> LearningRatePlan:
    """The run's recipe: the resumed plan keeps the uninterrupted run's (it plans none)."""
    plan = ctx.spec.run_plan
    assert plan is not None and plan.learning_rate is not None
    return plan.learning_rate


class DdpRanks:
    """A plan's replicas under DDP on the first `processes` ranks (the others idle)."""

    def __init__(self, ctx: Context, plan: Plan, work: Workload, processes: int, feeds: Feeds) -> None:
        rank, dp = ctx.group.rank, plan.data_parallel_size
        self.plan, self.work, self.factor = plan, work, processes / dp
        self.group = first_ranks(processes)  # every rank takes part in forming it
        self.member = rank < processes
        self.feeds = {r: feeds(r) for r in (replica_range(rank, processes, dp) if self.member else ())}
        self.scales = [g.loss_scale or 0.0 for g in plan.replica_groups for _ in range(g.start, g.stop)]
        if not self.member:
            return
        self.module = work.module(ctx.dtype, ctx.device)
        self.model = DistributedDataParallel(
            self.module,
            device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
            process_group=self.group,
            find_unused_parameters=isinstance(work, Registered) or getattr(work, "base", None) is not None,
        )
        self.optimizer = build_optimizer(run_recipe(ctx), self.module.parameters())

    def step(self, ctx: Context, by_tokens: bool) -> tuple[int, float, int | None]:
        """The step's backward on this rank's replicas: (epoch, its part of the loss, valid tokens)."""
        reads = {r: next(feed) for r, feed in self.feeds.items()}
        epoch = next(iter(reads.values()))[0] if reads else 0
        dp, valid = self.plan.data_parallel_size, None
        counts = self.work.counts if isinstance(self.work, TokenWorkload) else None
        if by_tokens and counts is not None:
            mine = sum(counts(b, ctx.device)[0] for _, batches in reads.values() for b in batches)
            valid = int(summed([float(mine)], ctx.device)[0])
            scale = dp / valid if valid else 0.0
            batches: list[Batch] = [(b, scale, "sum") for _, bs in reads.values() for b in bs]
        else:
            batches = [
                (b, self.scales[r], self.plan.loss_reduction) for r, (_, bs) in reads.items() for b in bs
            ]
        if not self.member:
            return epoch, 0.0, valid
        total = micro_steps(self.model, batches, BatchFeed(self.work, ctx.dtype, ctx.device, self.factor))
        return epoch, total / dp, valid

    def clip(self, max_norm: float) -> None:
        torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm)

    def whole(self, ctx: Context) -> torch.Tensor | None:
        return torch.cat([p.detach().reshape(-1) for p in self.module.parameters()]) if ctx.leader else None

    def checkpoint(self, ctx: Context) -> dict[str, Any] | None:
        if not ctx.leader:
            return None
        return {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


class MeshRanks:
    """A plan's mesh (FSDP2 / HSDP / TP) on the first ranks its sizes need (the others idle)."""

    def __init__(self, ctx: Context, plan: Plan, work: Workload, feeds: Feeds, order: list[str]) -> None:
        sizes = mesh_sizes(plan) or {}
        processes = plan.world_size
        mesh = build_mesh(sizes, ctx.device) if processes == ctx.group.world else sub_mesh(sizes, ctx.device)
        self.group = first_ranks(processes)
        self.member, self.order = ctx.group.rank < processes, order
        if not self.member:
            self.feeds: dict[int, Iterator[ReplicaStep]] = {}
            return
        spec = dataclasses.replace(ctx.spec, mesh=sizes)
        self.me = MeshRank(spec, plan, ctx.group, work, ctx.parallelize or synthetic_parallelize, mesh=mesh)
        self.feeds = {self.me.dp_rank: feeds(self.me.dp_rank)}
        self.optimizer = build_optimizer(run_recipe(ctx), self.me.module.parameters())

    def step(self, ctx: Context, by_tokens: bool) -> tuple[int, float, int | None]:
        if not self.member:
            return 0, 0.0, None
        epoch, reads = next(next(iter(self.feeds.values())))
        return epoch, self.me.step(reads), None

    def clip(self, max_norm: float) -> None:
        self.me.clip(max_norm)

    def whole(self, ctx: Context) -> torch.Tensor | None:
        whole = self.me.whole_params(ctx.group.world) if self.member else None
        return None if whole is None else torch.cat([whole[n].reshape(-1) for n in self.order])

    def checkpoint(self, ctx: Context) -> dict[str, Any] | None:
        model = get_model_state_dict(self.me.module, options=FULL)
        optimizer = get_optimizer_state_dict(self.me.module, self.optimizer, options=FULL)
        return {"model": model, "optimizer": optimizer} if ctx.leader else None

    def load(self, state: dict[str, Any]) -> None:
        whole = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.me.module, state["model"], options=whole)
        set_optimizer_state_dict(self.me.module, self.optimizer, state["optimizer"], options=whole)


Ranks = DdpRanks | MeshRanks
