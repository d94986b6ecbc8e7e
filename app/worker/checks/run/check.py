"""A check's run: after the first step's check, `steps` optimizer steps of the plan's recipe
on the warm ranks under DDP, as a training job would take them, held step by step against the
single-process reference run on rank 0 (referee.py), with the run-level controls.

Each replica reads through the plan's sampler with `set_epoch` at every epoch
(training/replica_feed.py), runs its micro-batches under `no_sync()` but the last with the
plan's loss scales (under loss_normalization token: each micro-batch's summed token loss times
data_parallel_size / N, N the step's valid tokens all-reduced over the group, as torchtitan
counts them), the gradient is clipped by the global norm of the all-reduced gradient when the
recipe clips, the lr is `lr_of` of the step, and the recipe's optimizer steps. A process
running several replicas sums their gradients, times processes / replicas, as the first step
does (gradients.ddp_gradient).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import ClassVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from app.contract.check_result import CheckResult, ControlOutcome, SkippedControl
from app.contract.kinds.run import RunOutcome
from app.contract.spec import CheckSpec, replica_range
from app.core.learning_rate.recipe_summary import lr_of
from app.core.records.plan import Plan
from app.worker.checks.kind import Context, Laps, Stage
from app.worker.checks.run.referee import Referee
from app.worker.training.gradients import Batch, BatchFeed, micro_steps
from app.worker.training.reference_run import build_optimizer
from app.worker.training.replica_feed import replica_steps
from app.worker.training.token_model import TokenWorkload
from app.worker.training.workload import Registered, Workload


def run_workload(spec: CheckSpec, workload: Workload) -> Workload:
    """What the run trains: the tokens check's workload for a tokens plan (as token_check
    builds it), else the check's own."""
    if spec.workload != "tokens" or isinstance(workload, TokenWorkload):
        return workload
    return TokenWorkload(
        spec.seed, spec.sequence_length, workload if isinstance(workload, Registered) else None
    )


def _all_reduced(values: list[float], device: torch.device, dtype: torch.dtype) -> list[float]:
    summed = torch.tensor(values, dtype=dtype, device=device)
    dist.all_reduce(summed)
    return [float(v) for v in summed.tolist()]


@dataclass
class _Run:
    """What the DDP run builds and records on this rank."""

    plan: Plan
    work: Workload
    module: torch.nn.Module
    model: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    feeds: dict[int, Iterator[tuple[int, list[list[int]]]]]  # each local replica's steps
    referee: Referee | None  # rank 0's reference run and run-level controls, in lockstep
    by_tokens: bool
    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)
    valid: list[int | None] = field(default_factory=list)
    outcome: tuple[RunOutcome, tuple[ControlOutcome, ...], tuple[SkippedControl, ...]] | None = None


class DdpRun:
    """After the first step, `steps` optimizer steps of the plan's recipe on DDP replicas."""

    name: ClassVar[str] = "ddp_run"
    stage: ClassVar[Stage] = "run"
    # The reference run and the controls' runs are trained in lockstep with the plan's run on
    # rank 0: their time is set aside under run_reference while the run's lap runs.
    laps: ClassVar[Laps] = Laps(plan="run", controls=None, reference="run_reference")

    def applies(self, spec: CheckSpec) -> bool:
        return spec.steps > 1

    def prepare(self, ctx: Context) -> _Run:
        spec, device = ctx.spec, ctx.device
        plan = spec.run_plan
        assert plan is not None and plan.learning_rate is not None, "a run's spec carries its plan"
        work = run_workload(spec, ctx.workload)
        by_tokens = spec.workload == "tokens" and spec.loss_normalization == "token"
        module = work.module(ctx.dtype, device)
        model = DistributedDataParallel(
            module,
            device_ids=[device.index] if device.type == "cuda" else None,
            # A registered model may leave parameters without a gradient (the first step says so).
            find_unused_parameters=isinstance(work, Registered) or getattr(work, "base", None) is not None,
        )
        optimizer = build_optimizer(plan.learning_rate, module.parameters())
        local = replica_range(ctx.group.rank, ctx.group.world, plan.data_parallel_size)
        feeds = {r: replica_steps(plan, r, spec.steps) for r in local}
        referee = None
        if ctx.leader:
            counts = work.counts if isinstance(work, TokenWorkload) else None
            tokens = (lambda indices: counts(indices, device)[0]) if by_tokens and counts else None
            referee = Referee(
                plan, spec.steps, work, dtype_name=spec.dtype, device=device, valid_tokens=tokens
            )
            ctx.timer.set_aside("run_reference", referee.seconds)
        return _Run(plan, work, module, model, optimizer, feeds, referee, by_tokens)

    def plan(self, ctx: Context, state: _Run) -> None:
        plan, device = state.plan, ctx.device
        recipe = plan.learning_rate
        assert recipe is not None
        dp = plan.data_parallel_size
        factor = ctx.group.world / dp
        counts = state.work.counts if isinstance(state.work, TokenWorkload) else None
        scales = [g.loss_scale or 0.0 for g in plan.replica_groups for _ in range(g.start, g.stop)]
        for k in range(ctx.spec.steps):
            reads = {r: next(feed) for r, feed in state.feeds.items()}
            state.epochs.append(next(iter(reads.values()))[0] if reads else 0)
            if state.by_tokens and counts is not None:
                mine = sum(counts(b, device)[0] for _, batches in reads.values() for b in batches)
                n = int(_all_reduced([float(mine)], device, torch.float64)[0])
                state.valid.append(n)
                scale = float(Fraction(dp, n)) if n else 0.0
                batches: list[Batch] = [(b, scale, "sum") for _, bs in reads.values() for b in bs]
            else:
                state.valid.append(None)
                batches = [(b, scales[r], plan.loss_reduction) for r, (_, bs) in reads.items() for b in bs]
            total = micro_steps(state.model, batches, BatchFeed(state.work, ctx.dtype, device, factor))
            state.losses.append(total / dp)
            if recipe.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(state.module.parameters(), recipe.max_grad_norm)
            rate = lr_of(recipe, k)
            for param_group in state.optimizer.param_groups:
                param_group["lr"] = rate
            state.optimizer.step()
            state.lrs.append(rate)
            if state.referee is not None:
                spent = state.referee.seconds
                state.referee.step(torch.cat([p.detach().reshape(-1) for p in state.module.parameters()]))
                ctx.timer.set_aside("run_reference", state.referee.seconds - spent)
        state.losses = _all_reduced(state.losses, device, torch.float64)

    def controls(self, ctx: Context, state: _Run) -> None:
        """The run-level controls train beside the reference run on rank 0 (referee.py)."""

    def measure(self, ctx: Context, state: _Run) -> bool:
        return False

    def reference(self, ctx: Context, state: _Run) -> None:
        assert state.referee is not None
        state.outcome = state.referee.outcome(state.losses, state.lrs, state.epochs, state.valid)

    def result(self, ctx: Context, state: _Run, prior: CheckResult | None) -> CheckResult:
        assert prior is not None and state.outcome is not None
        return prior.with_run(ctx.spec.steps, *state.outcome)
