"""What the resume check (resume_check.py) is built from: where each resumed replica reads, the
process groups the resumed ranks form, and the resume controls.

A resumed replica reads as a training job restarted from a checkpoint reads: torch's
`DistributedSampler` for the new number of replicas, `set_epoch(epoch)`, its first `skip`
indices skipped (Accelerate's `skip_first_batches`, a restored loader position), the rest in
micro-batches, an epoch cut at its last whole optimizer step as the plan cuts it. Where each
replica resumes is the core's (app.core.resume: `replica_groups[].skip_samples`).

The controls are resumes gone wrong, each trained on rank 0 from the reference run's own state
at the checkpoint (a copy of its trainer: the steps before it are the reference's). Each runs
where it changes the run (the samples a step reads, their weights or its lr differ from the
right resume's on some step); else it is skipped with the reason.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.utils.data import DistributedSampler

from app.contract.check_result import ControlOutcome, SkippedControl
from app.contract.run_result import ControlStep
from app.core.plan_types import Plan
from app.core.recipe import lr_of
from app.worker.checks.controls import Control
from app.worker.checks.result_parts import DETECTION_FACTOR
from app.worker.training.gradients import compare
from app.worker.training.mesh_models import mesh_names
from app.worker.training.plan_steps import dataset_size
from app.worker.training.reference_run import ReferenceStep, ReferenceTrainer, RunVariant, StepIndices
from app.worker.training.samplers import IndexDataset

ReplicaStep = tuple[int, list[list[int]]]  # (epoch, this replica's micro-batches of indices)


@dataclass(frozen=True, slots=True)
class Layout:
    """How the resumed replicas read: how many, their micro-batch and accumulation, where the
    resumed epoch starts in each one's shard, and each one's weight on a micro-batch's loss."""

    replicas: int
    micro: int
    accumulation: int
    skip: tuple[int, ...]  # per replica, indices of its shard skipped in the resumed epoch
    scales: tuple[float, ...]  # per replica, loss_scale / replicas (what DDP's mean makes of it)


def layout_of(plan: Plan, skip: Callable[[int], int], *, keep: Plan | None = None) -> Layout:
    """`plan`'s replicas reading from `skip(replica)`; `keep`: with that plan's micro-batch,
    accumulation and loss scale instead (the global batch changes)."""
    own = keep or plan
    dp, group = plan.data_parallel_size, own.replica_groups[0]
    scale = (group.loss_scale or 0.0) / dp
    return Layout(
        dp,
        group.micro_batch_size,
        own.gradient_accumulation_steps,
        tuple(map(skip, range(dp))),
        (scale,) * dp,
    )


def resumed_feed(plan: Plan, layout: Layout, replica: int, epoch: int) -> Iterator[ReplicaStep]:
    """Replica `replica`'s optimizer steps from the resumed epoch `epoch` on, crossing epochs."""
    assert plan.sampler is not None
    sampler_plan, skip = plan.sampler, layout.skip[replica]
    sampler: DistributedSampler[int] = DistributedSampler(
        IndexDataset(dataset_size(plan)),
        num_replicas=layout.replicas,
        rank=replica,
        shuffle=sampler_plan.shuffle,
        seed=sampler_plan.seed,
        drop_last=sampler_plan.drop_last,
    )
    m, g = layout.micro, layout.accumulation
    while True:
        sampler.set_epoch(epoch)
        shard = list(sampler)[skip:]
        batches = [shard[i : i + m] for i in range(0, len(shard), m)]
        for step in range(len(batches) // g):
            yield epoch, batches[step * g : (step + 1) * g]
        epoch, skip = epoch + 1, 0


def layout_steps(plan: Plan, layout: Layout, epoch: int, steps: int) -> list[tuple[int, StepIndices]]:
    """Every replica's steps, `steps` of them: what rank 0's single-process runs train on."""
    feeds = [resumed_feed(plan, layout, r, epoch) for r in range(layout.replicas)]
    out: list[tuple[int, StepIndices]] = []
    for _ in range(steps):
        reads = [next(feed) for feed in feeds]
        out.append((reads[0][0], [batches for _, batches in reads]))
    return out


# The process groups and meshes of the resumed ranks, built once per default group (a warm
# rank keeps its group between checks, and every rank must create a group at the same time).
_groups: dict[tuple[object, int], dist.ProcessGroup] = {}
_meshes: dict[tuple[object, str, tuple[int, ...], tuple[str, ...]], DeviceMesh] = {}


def _current() -> object:
    """The default group, the groups built on an earlier one forgotten (a re-formed pool)."""
    world = dist.group.WORLD
    for kept in (_groups, _meshes):
        _forget(kept, world)
    return world


def _forget(kept: dict[Any, Any], world: object) -> None:
    for key in [k for k in kept if k[0] is not world]:
        del kept[key]


def first_ranks(n: int) -> dist.ProcessGroup | None:
    """The group of ranks 0..n-1 (None: the whole default group); every rank calls it."""
    if n == dist.get_world_size():
        return None
    key = (_current(), n)
    if key not in _groups:
        _groups[key] = dist.new_group(list(range(n)))
    return _groups[key]


def sub_mesh(sizes: dict[str, int], device: torch.device) -> DeviceMesh:
    """The mesh of `sizes` on the first ranks; the others take part in building it and hold no
    coordinate in it (DeviceMesh's non-participating ranks)."""
    names = tuple(mesh_names(sizes))
    shape = tuple(sizes[n] for n in names)
    key = (_current(), device.type, shape, names)
    if key not in _meshes:
        ranks = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
        _meshes[key] = DeviceMesh(device.type, ranks, mesh_dim_names=names)
    return _meshes[key]


def summed(values: list[float], device: torch.device) -> list[float]:
    """Summed over the default group: every rank takes part, an idle one with zeros."""
    summed = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(summed)
    return [float(v) for v in summed.tolist()]


def checkpoint_of(state: dict[str, Any] | None, group: dist.ProcessGroup | None) -> dict[str, Any]:
    """Rank 0's checkpoint, as every rank of `group` reads it from the one file."""
    box: list[bytes | None] = [None]
    if state is not None:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        box[0] = buffer.getvalue()
    dist.broadcast_object_list(box, src=0, group=group)
    assert box[0] is not None
    loaded: dict[str, Any] = torch.load(io.BytesIO(box[0]), weights_only=True)
    return loaded


RESUME_WITHOUT_SKIP = Control(
    "resume_without_skip",
    "the resumed ranks call set_epoch(epoch) but skip nothing: the epoch's data starts again from "
    "its first step",
)
RESUME_SCHEDULE_RESTART = Control(
    "resume_schedule_restart",
    "the lr schedule is not restored: the resumed run's step at_step + j runs at the schedule's step j",
)
RESUME_KEEPS_MICRO_BATCH = Control(
    "resume_keeps_micro_batch",
    "the resumed replicas keep the old micro-batch and accumulation (and loss scale): the global "
    "batch shrinks or grows with the replicas",
)
RESUME_PER_RANK_POSITION = Control(
    "resume_per_rank_position",
    "each new rank restores the position the old rank of its number had in its own shard (per-rank "
    "loader states): it skips the old shard's count of samples in its new shard",
)


@dataclass
class _Fork:
    """One way of resuming, trained on rank 0 from the reference's state at the checkpoint."""

    control: Control
    trainer: ReferenceTrainer
    steps: list[tuple[int, StepIndices]]
    taken: list[ReferenceStep]
    off: list[tuple[float, float]]


class ResumeControls:
    """The resume controls beside the reference run from `at_step` on (rank 0)."""

    def __init__(self, plan: Plan, new: Plan, right: Layout, epoch: int, at_step: int, steps: int) -> None:
        self.tolerance, self.at_step = 0.0, at_step
        self.plan, self.new, self.right, self.epoch, self.left = plan, new, right, epoch, steps - at_step
        self.right_steps = layout_steps(new, right, epoch, self.left)
        self.ways: list[tuple[Control, Layout, Callable[[int], int]]] = []
        self.skipped: list[SkippedControl] = []
        old = plan.replica_groups[0]
        per_rank = old.micro_batch_size * plan.gradient_accumulation_steps * (at_step % self._per_epoch())
        for control, layout, lr_step in (
            (RESUME_WITHOUT_SKIP, _with_skip(right, lambda r: 0), _same),
            (RESUME_SCHEDULE_RESTART, right, lambda j: j - at_step),
            (RESUME_KEEPS_MICRO_BATCH, layout_of(new, lambda r: right.skip[r], keep=plan), _same),
            (RESUME_PER_RANK_POSITION, _with_skip(right, lambda r: per_rank), _same),
        ):
            reason = self._same_run(control, layout, lr_step)
            if reason is None:
                self.ways.append((control, layout, lr_step))
            else:
                self.skipped.append(SkippedControl(control.name, reason))
        self.forks: list[_Fork] = []

    def _per_epoch(self) -> int:
        assert self.plan.sampler is not None
        return self.plan.sampler.optimizer_steps_per_epoch

    def _same_run(self, control: Control, layout: Layout, lr_step: Callable[[int], int]) -> str | None:
        """Why this resume trains the right one exactly on these steps; None when it does not."""
        recipe = self.plan.learning_rate
        assert recipe is not None
        steps = range(self.at_step, self.at_step + self.left)
        if any(lr_of(recipe, j) != lr_of(recipe, lr_step(j)) for j in steps):
            return None
        read = layout_steps(self.new, layout, self.epoch, self.left)
        if [_weighed(s, layout, self.plan) for _, s in read] != [
            _weighed(s, self.right, self.plan) for _, s in self.right_steps
        ]:
            return None
        where = f"from step {self.at_step} to {steps[-1]}"
        if control is RESUME_SCHEDULE_RESTART:
            return f"the schedule gives the same lr {where} as from step 0 on: restarting it changes nothing"
        if self.at_step % self._per_epoch() == 0:
            return f"the checkpoint falls on an epoch's start (step {self.at_step}): there is nothing to skip"
        if layout.replicas == self.plan.data_parallel_size:
            return (
                "the run resumes on the plan's own replicas: every rank's position and split are the old ones"
            )
        return f"{where} it reads the same samples with the same weights as the right resume"

    def fork(self, reference: ReferenceTrainer, tolerance: float) -> None:
        """At the checkpoint: each control starts from the reference's state."""
        self.tolerance = tolerance
        for control, layout, lr_step in self.ways:
            trainer = copy.deepcopy(reference)
            trainer.scales = list(layout.scales)
            trainer.variant = RunVariant(scheduler_step=lr_step)
            steps = (
                self.right_steps
                if layout == self.right
                else layout_steps(self.new, layout, self.epoch, self.left)
            )
            self.forks.append(_Fork(control, trainer, steps, [], []))

    def step(self, k: int, reference: torch.Tensor) -> None:
        """Each control's step k, against the reference's parameters after it."""
        for fork in self.forks:
            epoch, replicas = fork.steps[k - self.at_step]
            fork.taken.append(fork.trainer._step(k, epoch, replicas))
            fork.off.append(compare(fork.trainer.flat_params(), reference))

    def outcome(
        self,
    ) -> tuple[list[ControlOutcome], dict[str, tuple[ControlStep, ...]], list[SkippedControl]]:
        outcomes, ran = [], {}
        for fork in self.forks:
            max_abs, rel = fork.off[-1]
            detected = rel > DETECTION_FACTOR * self.tolerance
            outcomes.append(
                ControlOutcome(fork.control.name, fork.control.description, rel, max_abs, detected)
            )
            ran[fork.control.name] = tuple(
                ControlStep(s.step, s.lr, s.loss, o[1]) for s, o in zip(fork.taken, fork.off, strict=True)
            )
        return outcomes, ran, list(self.skipped)


def _same(step: int) -> int:
    return step


def _with_skip(layout: Layout, skip: Callable[[int], int]) -> Layout:
    return Layout(
        layout.replicas,
        layout.micro,
        layout.accumulation,
        tuple(map(skip, range(layout.replicas))),
        layout.scales,
    )


def _weighed(step: StepIndices, layout: Layout, plan: Plan) -> list[tuple[int, float]]:
    """A step's samples with each one's weight in the step's loss, in order: the same list for
    two layouts means the same gradient."""
    per_mean = plan.loss_reduction == "mean" and any(g.loss_scale is not None for g in plan.replica_groups)
    out = [
        (i, round(layout.scales[r] / (len(batch) if per_mean else 1), 12))
        for r, batches in enumerate(step)
        for batch in batches
        for i in batch
    ]
    return sorted(out)
