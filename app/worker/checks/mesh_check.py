"""The mesh check: one training step of a plan on its own device mesh (tensor parallel with
DTensor, FSDP2 / HSDP with `fully_shard`, pipeline parallel with torch.distributed.pipelining
and the plan's micro-batches as the schedule's), every parameter's `full_tensor()` gradient
compared with the single-process gradient of the mean loss over the same global batch.

A check kind (kind.py) the driver runs on an initialised default process group of exactly one
process per mesh rank: the group the warm ranks keep from check to check (rank.kept_group), as
for DDP, or the rank program's under torchrun (`app.worker.gradcheck`). On a mesh
without a pipeline the controls are weighings of one backward per distinct micro-batch
(training.mesh_gradients); the plan's own step always runs through the real wrappers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import cycle, islice
from typing import Any, ClassVar, Literal

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.utils.data import DistributedSampler

from app.contract.check_result import CheckResult, SkippedControl
from app.contract.mesh_spec import mesh_world, wrapper_of
from app.contract.spec import CheckSpec
from app.core.device_mesh import ORDER
from app.worker.checks.controls import Control, split_controls
from app.worker.checks.kind import Context, Laps
from app.worker.checks.mesh_controls import (
    PIPELINE_LOSS_NOT_SCALED,
    REPLICAS_FROM_SHARD_GROUP,
    SAMPLER_BY_GLOBAL_RANK,
    TENSOR_PEERS_DIFFERENT_DATA,
    split_mesh_controls,
)
from app.worker.checks.mesh_steps import MeshSteps
from app.worker.checks.result_parts import Measured, judged_result
from app.worker.checks.shards import Shards
from app.worker.training.assembled_gradient import assembled_gradient
from app.worker.training.gradients import reference_gradient
from app.worker.training.mesh_gradients import Share, weighted_mesh_gradients
from app.worker.training.mesh_models import (
    build_mesh,
    full_gradients,
    gathered_gradients,
    kept_module,
    shard_data_parallel,
    synthetic_parallelize,
)
from app.worker.training.samplers import IndexDataset
from app.worker.training.stacked_passes import Pipeline, stackable
from app.worker.training.workload import Workload

Reads = list[list[int]]  # a rank's micro-batches of sample indices


class _Rank:
    """This rank's place in the mesh and what it reads."""

    def __init__(self, spec: CheckSpec, sizes: dict[str, int], rank: int) -> None:
        place: dict[str, int] = {}
        rest = rank
        for name in reversed(ORDER):
            rest, place[name] = divmod(rest, sizes[name])
        self.spec, self.sizes, self.rank, self.place = spec, sizes, rank, place
        self.dp_rank = place["dp_replicate"] * sizes["dp_shard"] + place["dp_shard"]
        self.micro = spec.micro_batch_sizes()[self.dp_rank]
        self.scale = spec.loss_scales()[self.dp_rank]

    def sampler(self, num_replicas: int, rank: int, seed: int) -> Reads:
        """The first step's micro-batches of a DistributedSampler built this way (read around
        again if its shard is shorter than a step, as the next epoch would)."""
        spec = self.spec
        sampler: DistributedSampler[int] = DistributedSampler(
            IndexDataset(spec.num_samples),
            num_replicas=num_replicas,
            rank=rank,
            shuffle=spec.shuffle,
            seed=seed,
            drop_last=spec.drop_last,
        )
        sampler.set_epoch(0)
        g, m = spec.gradient_accumulation_steps, self.micro
        flat = list(islice(cycle(iter(sampler)), g * m))
        return [flat[k * m : (k + 1) * m] for k in range(g)]

    def reads(self, control: Control | None, plan_reads: Reads) -> Reads:
        dp, seed = self.spec.data_parallel_size, self.spec.data_seed
        if control is SAMPLER_BY_GLOBAL_RANK:
            return self.sampler(mesh_world(self.sizes), self.rank, seed)
        if control is TENSOR_PEERS_DIFFERENT_DATA:
            return self.sampler(dp, self.dp_rank, seed + self.place["tp"])
        if control is REPLICAS_FROM_SHARD_GROUP:
            return self.sampler(self.sizes["dp_shard"], self.place["dp_shard"], seed)
        return plan_reads


@dataclass(frozen=True, slots=True)
class _Run:
    """One step to run on the mesh: the plan's (no control), or a control's mistake."""

    control: Control | None
    reads: Reads
    scale: float
    reduction: str
    scale_grads: bool = True


def _control_runs(me: _Rank, shards: Shards, plan_reads: Reads) -> tuple[list[_Run], list[SkippedControl]]:
    """Today's DDP controls (they change sample weights, whatever the mesh) where they change
    this plan's gradient, then the mesh's own."""
    spec = me.spec
    applicable, skipped = split_controls(spec, shards.every_replica, shards.epoch[: spec.global_batch_size])
    runs = [
        _Run(
            c,
            shards.control_batches(c, me.dp_rank, plan_reads),
            float(c.loss_scale(spec, me.micro)),
            c.loss_reduction(spec),
        )
        for c in applicable
    ]
    mesh_applicable, mesh_skipped = split_mesh_controls(
        me.sizes, spec.gradient_accumulation_steps, spec.shuffle
    )
    runs += [
        _Run(
            c,
            me.reads(c, plan_reads),
            me.scale,
            spec.loss_reduction,
            scale_grads=c is not PIPELINE_LOSS_NOT_SCALED,
        )
        for c in mesh_applicable
    ]
    return runs, skipped + mesh_skipped


def weighable(sizes: dict[str, int], stacked: bool, own_split: bool) -> bool:
    """Whether the controls can be weighings of shared passes (training.mesh_gradients): not
    under context parallel, whose shards of a sequence are not micro-batches of their own; under
    a pipeline only with the micro-batches stacked (the stages pass one forward along) and the
    built-in split into stages (each parameter on one stage)."""
    return sizes["cp"] == 1 and (sizes["pp"] == 1 or (stacked and not own_split))


# Mistakes whose reads differ between the tensor or pipeline peers of one replica: their
# micro-batches are never shared by content, so that every peer runs the same passes.
_PEERS_READ_APART = (SAMPLER_BY_GLOBAL_RANK, TENSOR_PEERS_DIFFERENT_DATA)


def _weighed(
    module: nn.Module,
    mesh: DeviceMesh,
    me: _Rank,
    workload: Workload,
    runs: list[_Run],
    numels: dict[str, int],
    *,
    plan: tuple[Reads, torch.Tensor] | None,
    stacked: bool,
    dtype: torch.dtype,
    device: torch.device,
) -> list[torch.Tensor]:
    """Each run's whole gradient from `module` (this rank's share, no data-parallel wrapper).
    A run whose schedule does not divide by its micro-batches (scale_grads off) weighs each by
    their number. `plan`: the plan's reads and its whole gradient from the real step, where
    every rank holds it, which a run that only scales the plan's losses is a multiple of."""
    g, sizes = me.spec.gradient_accumulation_steps, me.sizes
    steps = [
        [
            (
                (i, k) if r.control in _PEERS_READ_APART else None,
                batch,
                r.scale * (1 if r.scale_grads else g),
                r.reduction,
            )
            for k, batch in enumerate(r.reads)
        ]
        for i, r in enumerate(runs)
    ]
    pipeline = Pipeline(mesh["pp"].get_group(), me.place["pp"], sizes["pp"]) if sizes["pp"] > 1 else None
    share = Share(
        module,
        workload,
        numels,
        replicas=sizes["dp_replicate"] * sizes["dp_shard"],
        tensor_rank=me.place["tp"],
        tensor_size=sizes["tp"],
        stacked=stacked,
        pipeline=pipeline,
        dtype=dtype,
        device=device,
    )
    known = (
        None if plan is None else ([(None, b, me.scale, me.spec.loss_reduction) for b in plan[0]], plan[1])
    )
    return weighted_mesh_gradients(share, steps, known)


@dataclass
class _Step:
    """What the mesh kind builds and measures on this rank."""

    me: _Rank
    mesh: DeviceMesh
    base: nn.Module  # the whole model, as one process builds it
    split: Callable[[nn.Module, DeviceMesh], nn.Module]
    key: tuple[Any, ...]  # the parallelised modules' key on this mesh (mesh_models.kept_module)
    module: nn.Module  # this rank's share, wrapped
    plan_reads: Reads
    numels: dict[str, int]
    whole: torch.Tensor | None = None  # the plan's whole gradient where every rank holds it
    plan_grads: list[torch.Tensor] = field(default_factory=list)
    runs: list[_Run] = field(default_factory=list)
    skipped: list[SkippedControl] = field(default_factory=list)
    control_grads: list[torch.Tensor] = field(default_factory=list)
    reference: torch.Tensor | None = None


class MeshStep:
    """The plan's first step on its own mesh, one real process per mesh rank."""

    name: ClassVar[str] = "mesh"
    stage: ClassVar[Literal["step", "after"]] = "step"
    laps: ClassVar[Laps] = Laps()

    def applies(self, spec: CheckSpec) -> bool:
        return spec.mesh is not None

    def prepare(self, ctx: Context) -> _Step:
        spec, world = ctx.spec, ctx.group.world
        sizes = spec.mesh
        if sizes is None or mesh_world(sizes) != world:
            raise ValueError(f"a mesh check needs one process per mesh rank ({sizes}); it has {world}")
        me = _Rank(spec, sizes, ctx.group.rank)
        mesh = build_mesh(sizes, ctx.device)
        ctx.timer.lap("mesh")
        workload = ctx.workload
        base = workload.module(ctx.dtype, ctx.device)
        split: Callable[[nn.Module, DeviceMesh], nn.Module] = ctx.parallelize or synthetic_parallelize
        # One parallelised module serves every run (and the next check of this model on this
        # mesh: mesh_models.kept_module): each starts from no gradients and none changes a
        # weight (no optimizer step), as the next step of training would start.
        model = (workload.name, getattr(workload, "target", None), workload.seed)
        key = (
            *model,
            spec.dtype,
            str(ctx.device),
            tuple(sorted(sizes.items())),
            split.__module__,
            split.__qualname__,
        )
        module = kept_module(
            (*key, "wrapped"), base, lambda m: shard_data_parallel(split(m, mesh), mesh, sizes)
        )
        ctx.timer.lap("parallelize")
        plan_reads = ctx.shards.local(range(me.dp_rank, me.dp_rank + 1))[me.dp_rank]
        ctx.timer.lap("data")
        numels = {n: p.numel() for n, p in base.named_parameters()}
        return _Step(me, mesh, base, split, key, module, plan_reads, numels)

    def _steps(self, ctx: Context, state: _Step) -> MeshSteps:
        return MeshSteps(
            state.module,
            state.mesh,
            state.me.place,
            ctx.workload,
            accumulation=ctx.spec.gradient_accumulation_steps,
            dtype=ctx.dtype,
            device=ctx.device,
        )

    def plan(self, ctx: Context, state: _Step) -> None:
        self._steps(ctx, state).backward(state.plan_reads, state.me.scale, ctx.spec.loss_reduction)
        whole = assembled_gradient(state.module, state.numels, ctx.dtype, ctx.device)
        state.whole = whole
        state.plan_grads = (
            [whole.cpu()]
            if whole is not None
            else gathered_gradients([full_gradients(state.module)], state.numels, ctx.dtype, ctx.device)
        )

    def controls(self, ctx: Context, state: _Step) -> None:
        me, sizes = state.me, state.me.sizes
        state.runs, state.skipped = _control_runs(me, ctx.shards, state.plan_reads)
        stacked = stackable(state.base, ctx.workload, state.plan_reads[0])
        if weighable(sizes, stacked, ctx.parallelize is not None):
            share = kept_module((*state.key, "share"), state.base, lambda m: state.split(m, state.mesh))
            whole = state.whole
            weighed = _weighed(
                share,
                state.mesh,
                me,
                ctx.workload,
                state.runs,
                state.numels,
                plan=None if whole is None else (state.plan_reads, whole),
                stacked=stacked,
                dtype=ctx.dtype,
                device=ctx.device,
            )
            state.control_grads = [g.cpu() for g in weighed]
            return
        steps = self._steps(ctx, state)
        each = [steps.gradients(r.reads, r.scale, r.reduction, r.scale_grads) for r in state.runs]
        state.control_grads = (
            gathered_gradients(each, state.numels, ctx.dtype, ctx.device) if state.runs else []
        )

    def measure(self, ctx: Context, state: _Step) -> bool:
        return False

    def reference(self, ctx: Context, state: _Step) -> None:
        batch = ctx.shards.epoch[: ctx.spec.global_batch_size]
        state.reference = reference_gradient(ctx.workload, batch, ctx.dtype, ctx.device).cpu()

    def result(self, ctx: Context, state: _Step, prior: CheckResult | None) -> CheckResult:
        assert state.reference is not None
        spec, sizes = ctx.spec, state.me.sizes
        controls = [(r.control, g) for r, g in zip(state.runs, state.control_grads, strict=True) if r.control]
        measured = Measured(
            state.plan_grads[0],
            state.reference,
            controls,
            state.skipped,
            [],
            True,
            spec.micro_batch_sizes(),
        )
        dims = [(n, sizes[n]) for n in ORDER if sizes[n] > 1]
        return judged_result(
            spec,
            ctx.group,
            ctx.workload.name,
            measured,
            replicas_per_rank=1,
            mesh={"names": [n for n, _ in dims], "sizes": [s for _, s in dims]},
            wrapper=wrapper_of(sizes),
        )
