"""A check's run: after the first step's check, `steps` optimizer steps of the plan's recipe
on the warm ranks under DDP, as a training job would take them, held step by step against the
single-process reference run on rank 0 (run_referee.py), with the run-level controls.

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

import time
from fractions import Fraction

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from app.contract.check_result import CheckResult
from app.contract.run_request import planned_run
from app.contract.spec import CheckSpec, replica_range
from app.core.plan_types import Plan
from app.core.recipe import lr_of
from app.worker.checks.result_parts import CheckGroup
from app.worker.checks.run_referee import Referee
from app.worker.training.gradients import Batch, micro_steps
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


def run_ddp_run(
    spec: CheckSpec, group: CheckGroup, workload: Workload, first: CheckResult | None
) -> CheckResult | None:
    """Train the run on an initialised default process group; rank 0 returns `first` (the
    first step's result) with the run."""
    started = time.perf_counter()
    dtype, device = getattr(torch, spec.dtype), group.device
    plan: Plan = planned_run(spec.run_plan or {}, on_samples=spec.workload != "tokens")
    recipe = plan.learning_rate
    assert recipe is not None
    work = run_workload(spec, workload)
    by_tokens = spec.workload == "tokens" and spec.loss_normalization == "token"
    dp, steps = plan.data_parallel_size, spec.steps
    module = work.module(dtype, device)
    model = DistributedDataParallel(
        module,
        device_ids=[device.index] if device.type == "cuda" else None,
        # A registered model may leave parameters without a gradient (the first step says so).
        find_unused_parameters=isinstance(work, Registered) or getattr(work, "base", None) is not None,
    )
    optimizer = build_optimizer(recipe, module.parameters())
    local = replica_range(group.rank, group.world, dp)
    feeds = {r: replica_steps(plan, r, steps) for r in local}
    factor = group.world / dp
    counts = work.counts if isinstance(work, TokenWorkload) else None
    referee = None
    if group.rank == 0:
        tokens = (lambda indices: counts(indices, device)[0]) if by_tokens and counts else None
        referee = Referee(plan, steps, work, dtype_name=spec.dtype, device=device, valid_tokens=tokens)
    scales = [g.loss_scale or 0.0 for g in plan.replica_groups for _ in range(g.start, g.stop)]
    losses: list[float] = []
    lrs: list[float] = []
    epochs: list[int] = []
    valid: list[int | None] = []
    for k in range(steps):
        reads = {r: next(feeds[r]) for r in local}
        epochs.append(next(iter(reads.values()))[0] if reads else 0)
        if by_tokens and counts is not None:
            mine = sum(counts(b, device)[0] for _, batches in reads.values() for b in batches)
            n = int(_all_reduced([float(mine)], device, torch.float64)[0])
            valid.append(n)
            scale = float(Fraction(dp, n)) if n else 0.0
            batches: list[Batch] = [(b, scale, "sum") for _, bs in reads.values() for b in bs]
        else:
            valid.append(None)
            batches = [(b, scales[r], plan.loss_reduction) for r, (_, bs) in reads.items() for b in bs]
        total = micro_steps(model, batches, factor=factor, workload=work, dtype=dtype, device=device)
        losses.append(total / dp)
        if recipe.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(module.parameters(), recipe.max_grad_norm)
        rate = lr_of(recipe, k)
        for param_group in optimizer.param_groups:
            param_group["lr"] = rate
        optimizer.step()
        lrs.append(rate)
        if referee is not None:
            referee.step(torch.cat([p.detach().reshape(-1) for p in module.parameters()]))
    losses = _all_reduced(losses, device, torch.float64)
    if referee is None or first is None:
        return None
    run, controls, skipped = referee.outcome(losses, lrs, epochs, valid)
    total = time.perf_counter() - started
    laps = {"run": round(total - referee.seconds, 6), "run_reference": round(referee.seconds, 6)}
    return first.with_run(run, controls, skipped, laps)
