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
from typing import Any, ClassVar

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from app.contract.check_result import CheckResult, SkippedControl
from app.contract.mesh_spec import mesh_world, wrapper_of
from app.contract.spec import CheckSpec
from app.core.cluster.device_mesh import ORDER
from app.worker.checks.kind import Context, Laps, Stage
from app.worker.checks.mesh.reads import MeshRank, Reads, StepRun, control_runs, weighable, weighed
from app.worker.checks.mesh.steps import MeshSteps
from app.worker.checks.result_parts import Measured, judged_result
from app.worker.training.assembled_gradient import assembled_gradient
from app.worker.training.gradients import reference_gradient
from app.worker.training.mesh_models import (
    build_mesh,
    full_gradients,
    gathered_gradients,
    kept_module,
    shard_data_parallel,
    synthetic_parallelize,
)
from app.worker.training.stacked_passes import stackable


@dataclass
class _Step:
    """What the mesh kind builds and measures on this rank."""

    me: MeshRank
    mesh: DeviceMesh
    base: nn.Module  # the whole model, as one process builds it
    split: Callable[[nn.Module, DeviceMesh], nn.Module]
    key: tuple[Any, ...]  # the parallelised modules' key on this mesh (mesh_models.kept_module)
    module: nn.Module  # this rank's share, wrapped
    plan_reads: Reads
    numels: dict[str, int]
    whole: torch.Tensor | None = None  # the plan's whole gradient where every rank holds it
    plan_grads: list[torch.Tensor] = field(default_factory=list)
    runs: list[StepRun] = field(default_factory=list)
    skipped: list[SkippedControl] = field(default_factory=list)
    control_grads: list[torch.Tensor] = field(default_factory=list)
    reference: torch.Tensor | None = None


class MeshStep:
    """The plan's first step on its own mesh, one real process per mesh rank."""

    name: ClassVar[str] = "mesh"
    stage: ClassVar[Stage] = "step"
    laps: ClassVar[Laps] = Laps()

    def applies(self, spec: CheckSpec) -> bool:
        return spec.mesh is not None

    def prepare(self, ctx: Context) -> _Step:
        spec, world = ctx.spec, ctx.group.world
        sizes = spec.mesh
        if sizes is None or mesh_world(sizes) != world:
            raise ValueError(f"a mesh check needs one process per mesh rank ({sizes}); it has {world}")
        me = MeshRank(spec, sizes, ctx.group.rank)
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
        state.runs, state.skipped = control_runs(me, ctx.shards, state.plan_reads)
        stacked = stackable(state.base, ctx.workload, state.plan_reads[0])
        if weighable(sizes, stacked, ctx.parallelize is not None):
            share = kept_module((*state.key, "share"), state.base, lambda m: state.split(m, state.mesh))
            whole = state.whole
            grads = weighed(
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
            state.control_grads = [g.cpu() for g in grads]
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
