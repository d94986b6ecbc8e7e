"""The resume controls: resumes gone wrong, each trained on rank 0 from the reference run's own
state at the checkpoint (a copy of its trainer), run where it changes the run, else skipped with
the reason (parts.py says where the right resume reads)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch

from app.contract.check_result import ControlOutcome, SkippedControl
from app.contract.kinds.run import ControlStep
from app.core.learning_rate.recipe_summary import lr_of
from app.core.records.plan import Plan
from app.worker.checks.controls import Control
from app.worker.checks.result_parts import DETECTION_FACTOR
from app.worker.checks.resume.parts import ResumedReplicas, layout_of, layout_steps
from app.worker.training.gradients import compare
from app.worker.training.plan_steps import StepIndices
from app.worker.training.reference_run import ReferenceStep, ReferenceTrainer, RunVariant

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

    def __init__(
        self, plan: Plan, new: Plan, right: ResumedReplicas, epoch: int, at_step: int, steps: int
    ) -> None:
        self.tolerance, self.at_step = 0.0, at_step
        self.plan, self.new, self.right, self.epoch, self.left = plan, new, right, epoch, steps - at_step
        self.right_steps = layout_steps(new, right, epoch, self.left)
        self.ways: list[tuple[Control, ResumedReplicas, Callable[[int], int]]] = []
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

    def _same_run(
        self, control: Control, layout: ResumedReplicas, lr_step: Callable[[int], int]
    ) -> str | None:
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


def _with_skip(layout: ResumedReplicas, skip: Callable[[int], int]) -> ResumedReplicas:
    return ResumedReplicas(
        layout.replicas,
        layout.micro,
        layout.accumulation,
        tuple(map(skip, range(layout.replicas))),
        layout.scales,
    )


def _weighed(step: StepIndices, layout: ResumedReplicas, plan: Plan) -> list[tuple[int, float]]:
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
