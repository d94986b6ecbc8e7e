"""A mesh check's run: after the first step's check (checks/mesh/check.py), `steps` optimizer steps of
the plan's recipe on the plan's own mesh (tensor parallel with DTensor, FSDP2 / HSDP with
`fully_shard`, pipeline stages under a torch.distributed.pipelining schedule), held step by
step against the single-process reference run on rank 0 (referee.py).

Every data-parallel rank reads its replica's samples through the plan's sampler with
`set_epoch` (its tensor and pipeline peers read the same ones); the gradient is clipped by the
global norm as torchtitan does it (each parameter's norm over its shards, the stages' norms
summed over the pipeline group); the recipe's optimizer steps the sharded parameters. After
each step the whole parameters are gathered on rank 0 for the comparison.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import DTensor

from app.contract.check_result import CheckResult, ControlOutcome, SkippedControl
from app.contract.kinds.run import RunOutcome
from app.contract.spec import CheckSpec
from app.core.cluster.device_mesh import ORDER
from app.core.learning_rate.recipe_summary import lr_of
from app.core.records.plan import Plan
from app.worker.checks.kind import Context, Laps, Stage
from app.worker.checks.result_parts import CheckGroup
from app.worker.checks.run.referee import Referee
from app.worker.training.mesh_models import (
    Parallelize,
    accumulate,
    build_mesh,
    shard_data_parallel,
    synthetic_parallelize,
)
from app.worker.training.reference_run import build_optimizer
from app.worker.training.replica_feed import replica_steps
from app.worker.training.synthetic_model import backward
from app.worker.training.workload import Workload


def _place(sizes: dict[str, int], rank: int) -> dict[str, int]:
    place: dict[str, int] = {}
    rest = rank
    for name in reversed(ORDER):
        rest, place[name] = divmod(rest, sizes[name])
    return place


class MeshRank:
    """This rank's share of the run: its stage of the model, sharded, and how it steps."""

    def __init__(
        self,
        spec: CheckSpec,
        plan: Plan,
        group: CheckGroup,
        workload: Workload,
        split: Parallelize,
        mesh: DeviceMesh | None = None,  # another than the default group's (a resumed run's)
    ) -> None:
        assert spec.mesh is not None
        self.sizes, self.workload, self.device = spec.mesh, workload, group.device
        self.dtype = getattr(torch, spec.dtype)
        self.place = _place(self.sizes, group.rank)
        self.dp_rank = self.place["dp_replicate"] * self.sizes["dp_shard"] + self.place["dp_shard"]
        self.g, self.dp, self.reduction = (
            plan.gradient_accumulation_steps,
            plan.data_parallel_size,
            plan.loss_reduction,
        )
        self.scale = [g.loss_scale or 0.0 for g in plan.replica_groups for _ in range(g.start, g.stop)][
            self.dp_rank
        ]
        self.mesh = mesh or build_mesh(self.sizes, group.device)
        base = workload.module(self.dtype, group.device)
        self.module = shard_data_parallel(split(copy.deepcopy(base), self.mesh), self.mesh, self.sizes)
        self.pp = self.sizes["pp"]
        self.schedule = self._schedule() if self.pp > 1 else None
        # The rank whose losses count once per replica: the first tensor peer, the last stage.
        self.counts_loss = self.place["tp"] == 0 and self.place["cp"] == 0 and self.place["pp"] == self.pp - 1

    def _schedule(self) -> Schedule1F1B | ScheduleGPipe:
        stage = PipelineStage(
            self.module, self.place["pp"], self.pp, self.device, group=self.mesh["pp"].get_group()
        )

        def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            # The schedule divides by its micro-batches (scale_grads): undo it in the plan's scale.
            if self.workload.loss_fn is None:
                raise ValueError(
                    f"model {self.workload.name!r}: a pipeline-parallel run needs a loss_fn from its factory"
                )
            mean: torch.Tensor = self.workload.loss_fn(output, target)
            value = mean if self.reduction == "mean" else mean * output.shape[0]
            return value * (self.scale * self.g)

        kind = Schedule1F1B if self.g >= self.pp else ScheduleGPipe
        return kind(stage, n_microbatches=self.g, loss_fn=loss_fn)

    def step(self, reads: list[list[int]]) -> float:
        """The step's backward on this rank's share; this rank's part of the step's loss."""
        self.module.zero_grad(set_to_none=True)
        if self.schedule is not None:
            x, y = self.workload.batch([i for batch in reads for i in batch], self.dtype, self.device)
            losses: list[torch.Tensor] = []
            if self.place["pp"] == 0:
                self.schedule.step(x)
            elif self.place["pp"] == self.pp - 1:
                self.schedule.step(target=y, losses=losses)
            else:
                self.schedule.step()
            # loss_fn gave each micro-batch's loss x scale x g; the step's loss weighs it scale / dp.
            return sum(float(v) for v in losses) / (self.g * self.dp) if self.counts_loss else 0.0
        total = 0.0
        for k, batch in enumerate(reads):
            accumulate(self.module, k == len(reads) - 1)
            x, y = self.workload.batch(batch, self.dtype, self.device)
            loss = self.workload.loss(self.module, x, y, self.reduction)
            backward(loss * self.scale)
            total += loss.item() * self.scale
        return total / self.dp if self.counts_loss else 0.0

    def clip(self, max_norm: float) -> None:
        """clip_grad_norm_ over the whole model: each parameter's norm over its shards, the
        stages' squared norms summed over the pipeline group, torch's coefficient."""
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        squares = torch.zeros((), dtype=torch.float64, device=self.device)
        for grad in grads:
            norm = torch.linalg.vector_norm(grad)
            whole = norm.full_tensor() if isinstance(norm, DTensor) else norm
            squares = squares + whole.double() ** 2
        if self.pp > 1:
            dist.all_reduce(squares, group=self.mesh["pp"].get_group())
        coefficient = min(max_norm / (math.sqrt(float(squares)) + 1e-6), 1.0)
        with torch.no_grad():
            for grad in grads:
                grad.mul_(coefficient)

    def whole_params(self, world: int) -> dict[str, torch.Tensor] | None:
        """Every parameter, whole, by name, on rank 0 (every rank takes part); else None."""
        with torch.no_grad():
            mine = {
                n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().to("cpu").clone()
                for n, p in self.module.named_parameters()
            }
        if self.pp == 1:
            return mine if dist.get_rank() == 0 else None
        parts: list[dict[str, torch.Tensor] | None] = [None] * world
        dist.gather_object(mine, parts if dist.get_rank() == 0 else None, dst=0)
        if dist.get_rank() != 0:
            return None
        merged: dict[str, torch.Tensor] = {}
        for part in parts:
            merged.update(part or {})
        return merged


@dataclass
class _Run:
    """What the mesh run builds and records on this rank."""

    me: MeshRank
    optimizer: torch.optim.Optimizer
    feed: Iterator[tuple[int, list[list[int]]]]
    referee: Referee | None  # rank 0's reference run and run-level controls, in lockstep
    order: list[str]  # the whole model's parameter names, in its order
    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)
    outcome: tuple[RunOutcome, tuple[ControlOutcome, ...], tuple[SkippedControl, ...]] | None = None


class MeshRun:
    """After the first step, `steps` optimizer steps of the plan's recipe on the plan's mesh."""

    name: ClassVar[str] = "mesh_run"
    stage: ClassVar[Stage] = "run"
    laps: ClassVar[Laps] = Laps(plan="run", controls=None, reference="run_reference")

    def applies(self, spec: CheckSpec) -> bool:
        return spec.steps > 1 and spec.mesh is not None

    def prepare(self, ctx: Context) -> _Run:
        spec, group = ctx.spec, ctx.group
        plan = spec.run_plan  # a mesh check trains samples: build_spec weighed them so
        assert plan is not None and plan.learning_rate is not None, "a run's spec carries its plan"
        split: Callable[[nn.Module, DeviceMesh], nn.Module] = ctx.parallelize or synthetic_parallelize
        me = MeshRank(spec, plan, group, ctx.workload, split)
        optimizer = build_optimizer(plan.learning_rate, me.module.parameters())
        feed = replica_steps(plan, me.dp_rank, spec.steps)
        referee, order = None, []
        if ctx.leader:
            referee = Referee(plan, spec.steps, ctx.workload, dtype_name=spec.dtype, device=group.device)
            ctx.timer.set_aside("run_reference", referee.seconds)
            order = [n for n, _ in ctx.workload.module(me.dtype, group.device).named_parameters()]
        return _Run(me, optimizer, feed, referee, order)

    def plan(self, ctx: Context, state: _Run) -> None:
        recipe = ctx.spec.run_plan.learning_rate if ctx.spec.run_plan else None
        assert recipe is not None
        me = state.me
        for k in range(ctx.spec.steps):
            epoch, reads = next(state.feed)
            state.epochs.append(epoch)
            state.losses.append(me.step(reads))
            if recipe.max_grad_norm is not None:
                me.clip(recipe.max_grad_norm)
            rate = lr_of(recipe, k)
            for param_group in state.optimizer.param_groups:
                param_group["lr"] = rate
            state.optimizer.step()
            state.lrs.append(rate)
            whole = me.whole_params(ctx.group.world)
            if state.referee is not None and whole is not None:
                spent = state.referee.seconds
                state.referee.step(torch.cat([whole[n].reshape(-1) for n in state.order]))
                ctx.timer.set_aside("run_reference", state.referee.seconds - spent)
        summed = torch.tensor(state.losses, dtype=torch.float64, device=ctx.device)
        dist.all_reduce(summed)
        state.losses = summed.tolist()

    def controls(self, ctx: Context, state: _Run) -> None:
        """The run-level controls train beside the reference run on rank 0 (referee.py)."""

    def measure(self, ctx: Context, state: _Run) -> bool:
        return False

    def reference(self, ctx: Context, state: _Run) -> None:
        assert state.referee is not None
        steps = ctx.spec.steps
        state.outcome = state.referee.outcome(state.losses, state.lrs, state.epochs, [None] * steps)

    def result(self, ctx: Context, state: _Run, prior: CheckResult | None) -> CheckResult:
        assert prior is not None and state.outcome is not None
        return prior.with_run(ctx.spec.steps, *state.outcome)
