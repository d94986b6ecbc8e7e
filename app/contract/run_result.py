"""What a check of several optimizer steps found beside its first step: the run's trajectory
against the reference run's, step by step, what the epochs' ends did, and each run-level
control's trajectory. A `CheckResult` lays these keys out in its own object (the codec's
FLAT), null for a one-step check; the verdicts are derived from the measurements."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from app.contract.codec import named


@dataclass(frozen=True, slots=True)
class TrajectoryStep:
    """One optimizer step of the plan's run beside the reference run's."""

    step: int  # from 0
    epoch: int
    lr: float  # the lr the run stepped with
    loss: float  # the run's loss over the step's global batch, weighted as the plan says
    reference_loss: float  # the reference run's, on its own weights
    params_rel_l2: float  # the run's parameters after the step against the reference's
    valid_tokens: int | None  # the step's valid tokens (loss_normalization token)
    within_tolerance: bool  # params_rel_l2 and the loss's relative difference, within the run's tolerance


def step_matches(params_rel_l2: float, loss: float, reference_loss: float, tolerance: float) -> bool:
    return (
        math.isfinite(params_rel_l2)
        and params_rel_l2 <= tolerance
        and abs(loss - reference_loss) <= tolerance * abs(reference_loss)
    )


@dataclass(frozen=True, slots=True)
class ControlStep:
    """One optimizer step of a run-level control's run (a known mistake) against the reference."""

    step: int
    lr: float
    loss: float
    params_rel_l2: float


@dataclass(frozen=True, slots=True)
class EpochEnd:
    """How the run's epochs end, as the plan says and as it ran."""

    optimizer_steps_per_epoch: int
    epochs_run: int  # epochs the run's steps touched
    leftover: Literal["dropped"]  # what happens to the micro-batches after an epoch's last whole step
    leftover_micro_steps: int  # per epoch, dropped
    # Samples in each replica's last micro-batch of an epoch when it is short (an even split
    # whose shard is not a multiple of the micro-batch): it is weighted as the plan says, its
    # mean times the replica's loss scale, like every other micro-batch. None: none is short.
    short_micro_batch_samples: int | None


@dataclass(frozen=True, slots=True)
class RunOutcome:
    trajectory: tuple[TrajectoryStep, ...]
    # Per step: parameters' relative L2, and the loss's relative difference.
    tolerance: float = field(metadata=named("run_tolerance"))
    epoch_end: EpochEnd
    # Each run-level control that ran, by name.
    controls: dict[str, tuple[ControlStep, ...]] = field(metadata=named("control_trajectories"))

    derived: ClassVar[tuple[str, ...]] = ("final_params_rel_l2", "trajectory_matches")

    @property
    def final_params_rel_l2(self) -> float:
        return self.trajectory[-1].params_rel_l2 if self.trajectory else math.nan

    @property
    def trajectory_matches(self) -> bool:
        return bool(self.trajectory) and all(s.within_tolerance for s in self.trajectory)
