"""What a resolved recipe says of itself: its lr at any optimizer step (`lr_of`, through the
one lr function app.core.lr_schedule.lr_at), at warmup's end and the last step, and its
schedule in one sentence. app.core.recipe resolves the recipe and re-exports these."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from app.core.lr_schedule import lr_at
from app.core.plan_types import Decay, LearningRatePlan


def with_summary(lr: LearningRatePlan) -> LearningRatePlan:
    """The plan with the lr at warmup's end and at the last step, and its schedule sentence."""
    return dataclasses.replace(lr, **summary(*_values(lr)))


def _values(lr: LearningRatePlan) -> tuple[Any, ...]:
    """What summary and _sentence read of a plan, in their order."""
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
    `lr_of` and `schedule_sentence` say of the plan that holds them."""
    last = steps - 1 if steps else None
    shape: dict[str, Any] = {"start": start, "peak": peak, "warmup": warmup, "decay": decay, "floor": floor}
    shape |= {"last_step": last, "milestones": milestones, "gamma": gamma if gamma is not None else 0.1}
    return {
        "lr_at_warmup_end": lr_at(warmup, **shape),
        "lr_at_last_step": lr_at(last, **shape) if last is not None else None,
        "schedule": _sentence(start, peak, warmup, decay, floor, steps, milestones, gamma),
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


def _steps(values: Sequence[int]) -> str:
    return ", ".join(str(v) for v in values)


def schedule_sentence(lr: LearningRatePlan) -> str:
    """The schedule in words, as the plan states it and every export writes it."""
    return _sentence(*_values(lr))


def _sentence(
    start: float,
    peak: float,
    warmup: int,
    decay: str,
    floor: float,
    steps: int | None,
    milestones: tuple[int, ...],
    gamma: float | None,
) -> str:
    if decay == Decay.STEP:
        after = f"{peak!r}, x {gamma!r} at optimizer steps {_steps(milestones)}"
    elif decay == Decay.CONSTANT:
        after = f"constant {peak!r}"
    else:
        last = (steps or 1) - 1
        after = f"{decay} decay from {peak!r} to {floor!r} at the last step ({last})"
    if not warmup:
        return after
    return f"linear warmup from {start!r} to {peak!r} over {warmup} optimizer steps, then {after}"
