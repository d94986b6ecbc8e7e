"""What a resolved recipe says of itself: its lr at any optimizer step (`lr_of`, through the
one lr function app.core.learning_rate.lr_schedule.lr_at), at warmup's end and the last step, and its
schedule in one sentence. app.core.learning_rate.recipe resolves the recipe and re-exports these."""

from __future__ import annotations

import dataclasses
from typing import Any

from app.core.learning_rate.lr_schedule import lr_at
from app.core.records.plan import LearningRatePlan
from app.core.records.plan_request import Decay


def with_summary(lr: LearningRatePlan) -> LearningRatePlan:
    """The plan with the lr at warmup's end and at the last step, and its schedule sentence."""
    return dataclasses.replace(lr, **summary(*_values(lr)))


def _values(lr: LearningRatePlan) -> tuple[Any, ...]:
    """What summary reads of a plan, in its order."""
    return (
        lr.warmup_start_lr,
        lr.lr,
        lr.warmup_steps,
        lr.decay,
        lr.min_lr,
        lr.train_steps,
        lr.milestones,
        lr.gamma,
    )


def summary(
    start: float,
    peak: float,
    warmup: int,
    decay: str,
    floor: float,
    steps: int | None,
    milestones: tuple[int, ...],
    gamma: float | None,
) -> dict[str, Any]:
    """lr_at_warmup_end, lr_at_last_step and schedule of a recipe, from its values: what
    `lr_of` says of the plan that holds them, and the schedule in words, as the plan states it
    and every export writes it."""
    last = steps - 1 if steps else None
    shape: dict[str, Any] = {"start": start, "peak": peak, "warmup": warmup, "decay": decay, "floor": floor}
    shape |= {"last_step": last, "milestones": milestones, "gamma": gamma if gamma is not None else 0.1}
    if decay == Decay.STEP:
        after = f"{peak!r}, x {gamma!r} at optimizer steps {', '.join(str(m) for m in milestones)}"
    elif decay == Decay.CONSTANT:
        after = f"constant {peak!r}"
    else:
        after = f"{decay} decay from {peak!r} to {floor!r} at the last step ({(steps or 1) - 1})"
    if warmup:
        after = f"linear warmup from {start!r} to {peak!r} over {warmup} optimizer steps, then {after}"
    return {
        "lr_at_warmup_end": lr_at(warmup, **shape),
        "lr_at_last_step": lr_at(last, **shape) if last is not None else None,
        "schedule": after,
    }


def lr_of(lr: LearningRatePlan, step: int, last_step: int | None = None) -> float:
    """The recipe's lr at optimizer step `step`; `last_step` overrides the run's own."""
    if last_step is None and lr.train_steps:
        last_step = lr.train_steps - 1
    return lr_at(
        step,
        start=lr.warmup_start_lr,
        peak=lr.lr,
        warmup=lr.warmup_steps,
        decay=lr.decay,
        floor=lr.min_lr,
        last_step=last_step,
        milestones=lr.milestones,
        gamma=lr.gamma if lr.gamma is not None else 0.1,
    )


def schedule_sentence(lr: LearningRatePlan) -> str:
    """The schedule in words, as the plan states it and every export writes it."""
    return str(summary(*_values(lr))["schedule"])
