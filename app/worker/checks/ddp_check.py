"""The data-parallel check: one DDP training step of a plan, checked against a
single-process gradient over the same global batch, with deliberately wrong setups
(controls) that the comparison must catch.

A check kind (kind.py) the driver runs on an initialised default process group, for the warm
ranks of the worker and the rank program under torchrun alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import ClassVar

import torch

# The first DDP construction imports torch._dynamo (seconds): importing it here moves the
# cost to the fork server, before any check.
import torch._dynamo
from torch.nn.parallel import DistributedDataParallel

from app.contract.check_result import CheckResult, SkippedControl
from app.contract.equivalence import Finding
from app.contract.micro_batch_search import MicroBatchSearch
from app.contract.model_registry import sync_batch_norm_refusal
from app.contract.noise_scale import NoiseScaleReport
from app.contract.spec import CheckSpec, replica_range
from app.worker.checks import equivalence
from app.worker.checks import probe_answers as answers
from app.worker.checks.controls import SAMPLER, SampleControl, weigh_controls
from app.worker.checks.kind import Context, Laps, Stage
from app.worker.checks.result_parts import CheckGroup, Measured, judged_result
from app.worker.checks.shards import Pool, Shards
from app.worker.measure.micro_batch_fit import fit_micro_batch
from app.worker.measure.noise_measurement import measure_noise_scale
from app.worker.training.gradients import Batch, ddp_gradient, reference_gradient, weighted_gradients
from app.worker.training.sync_batch_norm import forward_is_collective, training_sync_batch_norms
from app.worker.training.workload import Workload, model_code


@dataclass
class _Step:
    """What the DDP kind builds and measures on this rank."""

    model: DistributedDataParallel
    findings: list[Finding]
    sampled: dict[int, list[list[int]]]  # this rank's replicas' micro-batches (unpooled)
    local: range
    search: MicroBatchSearch | None
    pools: list[Pool] | None = None  # this rank's replica groups, pooled (see `_pooled`)
    grad: torch.Tensor | None = None
    applicable: list[SampleControl] = field(default_factory=list)
    skipped: list[SkippedControl] = field(default_factory=list)
    ratios: dict[SampleControl, Fraction] = field(default_factory=dict)
    computed: dict[SampleControl, torch.Tensor] = field(default_factory=dict)
    noise: NoiseScaleReport | None = None
    reference: torch.Tensor | None = None


class DdpStep:
    """The plan's first step on DDP replicas (several per process where the pool is smaller)."""

    name: ClassVar[str] = "ddp"
    stage: ClassVar[Stage] = "step"
    laps: ClassVar[Laps] = Laps(measure="noise_scale")

    def applies(self, spec: CheckSpec) -> bool:
        return True  # the step of every spec the kinds before it in the registry leave

    def prepare(self, ctx: Context) -> _Step:
        search = None
        if ctx.spec.fit:
            ctx.spec, search = fit_micro_batch(ctx.spec, ctx.workload, ctx.device)
            ctx.timer.lap("micro_batch_search")
        spec, workload, group = ctx.spec, ctx.workload, ctx.group
        module = workload.module(ctx.dtype, ctx.device)
        _refuse_what_cannot_run(spec, workload, module, ctx.device)
        shards = ctx.shards
        ctx.timer.lap("model")
        model, findings = _wrapped(module, workload, spec, shards.derived(0)[0], group)
        ctx.timer.lap("ddp")
        local = replica_range(group.rank, group.world, spec.data_parallel_size)
        if _pooled(workload, module, local):
            step = _Step(model, findings, {}, local, search, pools=shards.pools(local))
        else:
            step = _Step(model, findings, shards.local(local), local, search)
        ctx.timer.lap("data")
        return step

    def _batches(self, ctx: Context, state: _Step, control: SampleControl | None) -> list[Batch]:
        if state.pools is not None:
            return _pooled_batches(ctx.spec, ctx.shards, state.pools, control)
        return _local_batches(ctx.spec, ctx.shards, state.sampled, control)

    def plan(self, ctx: Context, state: _Step) -> None:
        batches = self._batches(ctx, state, None)
        state.grad = ddp_gradient(state.model, batches, ctx.feed(ctx.workload))

    def controls(self, ctx: Context, state: _Step) -> None:
        spec, shards = ctx.spec, ctx.shards
        applicable, skipped, ratios = weigh_controls(spec, shards.every_replica, self._reference_batch(ctx))
        # A control that weighs every sample c times as the reference does is c times the
        # reference gradient where samples are independent of each other (the built-in model):
        # rank 0 scales the reference, and no rank runs a pass for it.
        state.ratios = ratios if ctx.workload.independent_samples else {}
        state.applicable, state.skipped = applicable, skipped
        passes = [c for c in applicable if c not in state.ratios]
        state.computed = dict(zip(passes, self._control_steps(ctx, state, passes), strict=True))

    def _control_steps(self, ctx: Context, state: _Step, controls: list[SampleControl]) -> list[torch.Tensor]:
        feed = ctx.feed(ctx.workload)
        runs = [self._batches(ctx, state, c) for c in controls]
        if forward_is_collective(state.model.module):
            return [ddp_gradient(state.model, b, feed) for b in runs]
        if state.pools is not None:  # already sums, each sample at its replica's weight
            return weighted_gradients(state.model.module, runs, feed)
        # A workload's sum over a batch's samples is its mean times their number: controls that
        # read the same micro-batch summed and averaged share its one backward.
        means = [
            [(b, scale * len(b), "mean") if r == "sum" else (b, scale, r) for b, scale, r in run]
            for run in runs
        ]
        return weighted_gradients(state.model.module, means, feed)

    def measure(self, ctx: Context, state: _Step) -> bool:
        if ctx.spec.noise_steps <= 0:
            return False
        state.noise = measure_noise_scale(state.model, ctx.spec, state.local, ctx.feed(ctx.workload))
        return True

    @staticmethod
    def _reference_batch(ctx: Context) -> Sequence[int]:
        return ctx.shards.epoch[: ctx.spec.global_batch_size]

    def reference(self, ctx: Context, state: _Step) -> None:
        state.reference = reference_gradient(ctx.workload, self._reference_batch(ctx), ctx.dtype, ctx.device)

    def result(self, ctx: Context, state: _Step, prior: CheckResult | None) -> CheckResult:
        assert state.grad is not None and state.reference is not None
        reference = state.reference
        control_grads = [
            (c, state.computed[c] if c in state.computed else reference * float(state.ratios[c]))
            for c in state.applicable
        ]
        shards = ctx.shards
        measured = Measured(
            state.grad,
            reference,
            control_grads,
            state.skipped,
            state.findings,
            shards.sampler_checked,
            shards.sizes,
        )
        return judged_result(
            ctx.spec, ctx.group, ctx.workload.name, measured, noise=state.noise, search=state.search
        )


def _refuse_what_cannot_run(
    spec: CheckSpec, workload: Workload, module: torch.nn.Module, device: torch.device
) -> None:
    if workload.dataset_size is not None and workload.dataset_size < spec.num_samples:
        raise ValueError(
            f"model {workload.name!r} has {workload.dataset_size} samples; the plan's epoch needs "
            f"{spec.num_samples}: give plan.dataset.num_samples at most {workload.dataset_size}"
        )
    synced = training_sync_batch_norms(module)
    if synced and device.type != "cuda":
        with model_code():  # refused before any collective: the ranks stay usable
            raise ValueError(sync_batch_norm_refusal(synced))


def _wrapped(
    module: torch.nn.Module, workload: Workload, spec: CheckSpec, probe: Sequence[int], group: CheckGroup
) -> tuple[DistributedDataParallel, list[Finding]]:
    """The module under DDP, and what it shows about DDP equivalence: its module tree, and
    runs of it on `probe` (the same samples on every rank) for randomness, rank dependence
    and unused parameters; answers a warm rank kept for this model are used when every rank
    kept them (probe_answers says when)."""
    dtype, device = getattr(torch, spec.dtype), group.device
    findings = equivalence.static_findings(module, spec, processes=group.world, own_loss=workload.own_loss)
    key = answers.key_of(dtype, device, probe, group.rank, group.world)
    found = answers.kept(workload, key, device)
    local = (
        found.local
        if found is not None
        else answers.local_probes(module, answers.probe_backward(workload, probe, dtype, device))
    )
    model = DistributedDataParallel(
        module,
        device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=bool(local.unused),
    )
    if found is None:
        found = answers.wrapped_probes(
            model.module, workload, probe, local, dtype=dtype, dtype_name=spec.dtype, device=device
        )
        answers.keep(workload, key, found)
    findings += equivalence.empirical_findings(
        stochastic=found.stochastic,
        rank=found.rank,
        processes=group.world,
        unused=list(found.local.unused),
        known=findings,
        dtype=spec.dtype,
        draws=list(found.draws),
    )
    return model, findings


# Beyond this many replicas on a process, a workload whose samples are independent runs one
# backward per replica group instead of one per replica (see `_pooled_batches`).
POOL_FROM_LOCAL_REPLICAS = 64


def _pooled(workload: Workload, module: torch.nn.Module, local: range) -> bool:
    return (
        len(local) > POOL_FROM_LOCAL_REPLICAS
        and workload.independent_samples
        and not forward_is_collective(module)
    )


def _pooled_batches(
    spec: CheckSpec, shards: Shards, pools: list[Pool], control: SampleControl | None
) -> list[Batch]:
    """This rank's step as one summed loss per replica group: replica r's loss, its scale
    times the mean (or the sum) of its micro-batch, is the sum of its samples' losses each
    weighted scale / micro (or scale), so a group's replicas add up to one backward of the sum
    over all their samples at that weight: the same gradient, linear in per-sample weights
    where samples are independent. A control reading other samples than the sampler's gives
    every replica of a group the same reads: counted once, weighted by the group's size."""
    out: list[Batch] = []
    reduction: str
    for pool in pools:
        if control is None:
            scale, reduction = pool.scale, spec.loss_reduction
        else:
            scale, reduction = float(control.loss_scale(spec, pool.micro)), control.loss_reduction(spec)
        if control is None or control.data == SAMPLER:
            out.append((pool.indices, scale / pool.micro if reduction == "mean" else scale, "sum"))
            continue
        replicas = pool.stop - pool.start
        for read in shards.control_batches(control, pool.start):
            out.append((read, scale * replicas / (len(read) if reduction == "mean" else 1), "sum"))
    return out


def _local_batches(
    spec: CheckSpec, shards: Shards, sampled: dict[int, list[list[int]]], control: SampleControl | None
) -> list[Batch]:
    """This rank's micro-batches of the step, each with its loss scale and reduction: the
    plan's, or those of a control's mistake."""
    out: list[Batch] = []
    for r, batches in sampled.items():
        if control is None:
            out += [(b, shards.scales[r], spec.loss_reduction) for b in batches]
        else:
            scale = float(control.loss_scale(spec, shards.sizes[r]))
            out += [
                (b, scale, control.loss_reduction(spec)) for b in shards.control_batches(control, r, batches)
            ]
    return out
