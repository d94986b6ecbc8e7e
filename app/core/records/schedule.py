"""The records of a training schedule (app.core.learning_rate.schedule): what is asked (a ramp-up, the run's
length, decay and floor) and what it answers (its constant-batch stages and its points)."""

from __future__ import annotations

from app.core.records.plan_request import Decay
from app.core.records.record import record
from app.core.records.resume import ScheduleResume


@record
class Rampup:
    start_batch_size: int
    batch_size_increment: int
    rampup_samples: int


@record
class ScheduleSpec:
    train_steps: int | None = None  # default: the recipe's run length (learning_rate.train_steps)
    rampup: Rampup | None = None
    decay: Decay | None = None  # default: the recipe's
    min_lr: float | None = None  # default: the recipe's
    max_points: int = 500


@record
class Stage:
    first_step: int
    steps: int
    global_batch_size: int
    gradient_accumulation_steps: int


@record
class SchedulePoint:
    step: int
    consumed_samples: int  # before this step
    global_batch_size: int
    gradient_accumulation_steps: int
    lr: float | None


@record
class Schedule:
    train_steps: int
    train_samples: int
    rampup_steps: int
    warmup_steps: int
    peak_lr: float | None
    min_lr: float | None
    decay: str
    stages: tuple[Stage, ...]
    points: tuple[SchedulePoint, ...]
    downsampled: bool
    warnings: tuple[str, ...]
    warmup_start_lr: float | None = None
    milestones: tuple[int, ...] = ()
    schedule: str | None = None  # the recipe in one sentence (LearningRatePlan.schedule)
    resume: ScheduleResume | None = None  # with the plan's resume (app.core.resume.ramp)
