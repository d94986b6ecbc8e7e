"""What a check of several optimizer steps found beside its first step: the run's trajectory
against the reference run's, step by step, what the epochs' ends did, and each run-level
control's trajectory. Typed here; `CheckResult` writes it into its JSON (`to_json`) and reads
it back (`from_json`). The verdicts are derived from the measurements."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class TrajectoryStep:
    """One optimizer step of the plan's run beside the reference run's."""

    step: int  # from 0
    epoch: int
    lr: float  # the lr the run stepped with
    loss: float  # the run's loss over the step's global batch, weighted as the plan says
    reference_loss: float  # the reference run's, on its own weights
    params_rel_l2: float  # the run's parameters after the step against the reference's
    valid_tokens: int | None = None  # the step's valid tokens (loss_normalization token)

    def matches(self, tolerance: float) -> bool:
        loss_off = abs(self.loss - self.reference_loss)
        return (
            math.isfinite(self.params_rel_l2)
            and self.params_rel_l2 <= tolerance
            and loss_off <= tolerance * abs(self.reference_loss)
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
    leftover: str  # what happens to the micro-batches after an epoch's last whole step
    leftover_micro_steps: int  # per epoch, dropped
    # Samples in each replica's last micro-batch of an epoch when it is short (an even split
    # whose shard is not a multiple of the micro-batch): it is weighted as the plan says, its
    # mean times the replica's loss scale, like every other micro-batch. None: none is short.
    short_micro_batch_samples: int | None


@dataclass(frozen=True, slots=True)
class RunOutcome:
    steps: int
    trajectory: tuple[TrajectoryStep, ...]
    tolerance: float  # per step: parameters' relative L2, and the loss's relative difference
    epoch_end: EpochEnd
    controls: dict[str, tuple[ControlStep, ...]]  # each run-level control that ran, by name

    @property
    def final_params_rel_l2(self) -> float:
        return self.trajectory[-1].params_rel_l2 if self.trajectory else math.nan

    @property
    def matches(self) -> bool:
        return bool(self.trajectory) and all(s.matches(self.tolerance) for s in self.trajectory)

    def to_json(self) -> dict[str, Any]:
        """The result's keys a run adds (`CheckResult.to_json` writes them, null without a run)."""
        return {
            "steps": self.steps,
            "trajectory": [
                {**_flat(s), "within_tolerance": s.matches(self.tolerance)} for s in self.trajectory
            ],
            "final_params_rel_l2": self.final_params_rel_l2,
            "trajectory_matches": self.matches,
            "run_tolerance": self.tolerance,
            "epoch_end": _flat(self.epoch_end),
            "control_trajectories": {
                name: [_flat(s) for s in steps] for name, steps in self.controls.items()
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunOutcome | None:
        if data.get("trajectory") is None:
            return None
        names = {f.name for f in fields(TrajectoryStep)}
        return cls(
            steps=data["steps"],
            trajectory=tuple(
                TrajectoryStep(**{k: v for k, v in s.items() if k in names}) for s in data["trajectory"]
            ),
            tolerance=data["run_tolerance"],
            epoch_end=EpochEnd(**data["epoch_end"]),
            controls={
                name: tuple(ControlStep(**s) for s in steps)
                for name, steps in data["control_trajectories"].items()
            },
        )


# A one-step check's values of the keys a run adds.
ONE_STEP = {
    "steps": 1,
    "trajectory": None,
    "final_params_rel_l2": None,
    "trajectory_matches": None,
    "run_tolerance": None,
    "epoch_end": None,
    "control_trajectories": None,
}


def _flat(item: Any) -> dict[str, Any]:
    return {f.name: getattr(item, f.name) for f in fields(item)}
