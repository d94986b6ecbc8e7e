"""Training schedules: batch-size ramp-up and the learning-rate warmup and decay, step by step.

Ramp-up follows Megatron-LM's `--rampup-batch-size <start> <increment> <samples>`: the global
batch starts at `start` and grows by `increment` each time another
`samples / ((target - start) / increment)` samples have been consumed, reaching the target
once `samples` samples are consumed. The micro-batch and data-parallel size stay fixed, so
every stage's batch must be a whole multiple of `micro x data_parallel_size`; what changes is
the number of accumulated micro-batches (Megatron's "number of micro-batches").

The learning rate is the plan's recipe (`learning_rate`: warmup from `warmup_start_lr`, then its
decay), step by step through the one lr function (app.core.learning_rate.lr_of). The request's
`train_steps`, `decay` and `min_lr`, where given, replace the recipe's run length, decay and
floor in this answer (checked as the plan's own would be). The lr is a function of the step, not
of the current batch: the ramp does not rescale it.

The answer's warnings are the plan's (what /v1/plans says about it), then the schedule's own.

The run is held as a handful of constant-batch stages, so a run of 10**12 steps costs no more
than one of 10, and the series handed back is downsampled to at most `max_points` points.
"""

from __future__ import annotations

import bisect
import dataclasses
import math

from app.core.errors.domain import InfeasiblePlan, InvalidValue
from app.core.learning_rate import recipe
from app.core.learning_rate.recipe_summary import lr_of, with_summary
from app.core.records.plan import LearningRatePlan, Plan
from app.core.records.plan_request import MAX_SAFE_INTEGER, Decay
from app.core.records.record import record
from app.core.records.schedule import Rampup, Schedule, SchedulePoint, ScheduleSpec, Stage

MAX_POINTS = 5000
MAX_STAGES = 100_000


def recipe_for(lr: LearningRatePlan, spec: ScheduleSpec, steps: int) -> LearningRatePlan:
    """The plan's recipe with this request's run length, decay and floor, checked as the plan's
    own are (pointers at the request's top-level fields)."""
    decay = spec.decay.value if spec.decay is not None else lr.decay
    floor = lr.min_lr if spec.min_lr is None else spec.min_lr
    if not (math.isfinite(floor) and 0 <= floor <= lr.lr):
        raise InvalidValue(f"min_lr must be from 0 to the peak learning rate {lr.lr!r}", pointer="/min_lr")
    if lr.warmup_steps >= steps:
        raise InvalidValue(
            f"the warmup of {lr.warmup_steps} optimizer steps must end before the run's last step: "
            f"the run has {steps} optimizer steps",
            pointer="/train_steps",
            suggestions={"train_steps": [lr.warmup_steps + 1]},
        )
    if decay == Decay.STEP and not lr.milestones:
        raise InvalidValue(
            "step decay needs the plan's learning_rate.milestones (or milestone_epochs)", pointer="/decay"
        )
    late = [m for m in lr.milestones if m >= steps] if decay == Decay.STEP else []
    if late:
        raise InvalidValue(
            f"milestone at optimizer step {late[0]} is past the run's last step {steps - 1}",
            pointer="/train_steps",
            suggestions={"train_steps": [late[-1] + 1]},
        )
    return with_summary(
        dataclasses.replace(
            lr,
            decay=decay,
            min_lr=floor,
            train_steps=steps,
            gamma=(lr.gamma if lr.gamma is not None else 0.1) if decay == Decay.STEP else None,
        )
    )


def _ramp_stages(plan: Plan, rampup: Rampup, steps: int) -> list[Stage]:
    target = plan.global_batch_size
    unit = plan.global_batch_size // plan.gradient_accumulation_steps  # micro x data-parallel size
    start, increment, ramp_samples = (
        rampup.start_batch_size,
        rampup.batch_size_increment,
        rampup.rampup_samples,
    )
    for name, value in (("start_batch_size", start), ("batch_size_increment", increment)):
        if value % unit:
            low, high = value // unit * unit, (value // unit + 1) * unit
            raise InfeasiblePlan(
                f"rampup.{name} {value} is not a multiple of micro-batch x data-parallel size = {unit}: "
                f"every stage's batch must split into whole micro-batches",
                pointer=f"/rampup/{name}",
                suggestions={f"rampup.{name}": [v for v in (low, high) if 0 < v <= target]},
            )
    if start >= target:
        raise InvalidValue(
            f"rampup.start_batch_size {start} must be below the global batch {target}",
            pointer="/rampup/start_batch_size",
            suggestions={"rampup.start_batch_size": [unit] if unit < target else []},
        )
    if (target - start) % increment:
        raise InfeasiblePlan(
            f"the ramp from {start} to {target} is not a whole number of increments of {increment}",
            pointer="/rampup/batch_size_increment",
            suggestions={"rampup.batch_size_increment": [target - start]},
        )
    increments = (target - start) // increment
    if increments > MAX_STAGES:
        raise InvalidValue(
            f"the ramp has {increments} stages; at most {MAX_STAGES}",
            pointer="/rampup/batch_size_increment",
        )
    # Megatron's own float expression decides every stage (MegatronRamp): exact
    # arithmetic or a rounded-up boundary disagrees with it where the consumed samples land
    # exactly on a boundary.
    ramp = MegatronRamp(start, increment, ramp_samples, target)
    stages: list[Stage] = []
    step, consumed = 0, 0
    while step < steps:
        batch = ramp.batch(consumed)
        if batch == target:
            break
        n = min(ramp.steps_at(batch, consumed), steps - step)
        stages.append(Stage(step, n, batch, batch // unit))
        step, consumed = step + n, consumed + n * batch
    if step < steps:
        stages.append(Stage(step, steps - step, target, plan.gradient_accumulation_steps))
    return stages


@record
class MegatronRamp:
    """Megatron's RampupBatchsizeNumMicroBatchesCalculator, in its own float arithmetic."""

    start: int
    increment: int
    ramp_samples: int
    target: int

    @property
    def per_increment(self) -> float:
        return self.ramp_samples / ((self.target - self.start) // self.increment)

    def batch(self, consumed: int) -> int:
        """The global batch `update(consumed)` sets: `int(consumed / (rampup_samples /
        increments))` increments past the start, the target once past the ramp."""
        if consumed > self.ramp_samples:
            return self.target
        return self.start + int(consumed / self.per_increment) * self.increment

    def steps_at(self, batch: int, consumed: int) -> int:
        """How many steps of `batch` run from `consumed` on before the batch changes:
        estimated from the stage's boundary, then corrected against `batch()` itself (float
        rounding moves the boundary by at most a step)."""
        stage = (batch - self.start) // self.increment
        boundary = min((stage + 1) * self.per_increment, self.ramp_samples + 1)
        n = max(1, math.ceil((boundary - consumed) / batch))
        while n > 1 and self.batch(consumed + (n - 1) * batch) != batch:
            n -= 1
        while self.batch(consumed + n * batch) == batch:
            n += 1
        return n


def _plan_warnings(plan: Plan, lr_plan: LearningRatePlan | None) -> list[str]:
    """The plan's own warnings, the one list every answer about the plan gives, with the
    floor's warning about this answer's decay and min_lr where the request replaces them."""
    warnings = list(plan.warnings)
    if lr_plan is None or plan.learning_rate is None:
        return warnings
    planned = recipe.min_lr_unused(plan.learning_rate.min_lr, plan.learning_rate.decay)
    answered = recipe.min_lr_unused(lr_plan.min_lr, lr_plan.decay)
    if planned == answered:
        return warnings
    return [w for w in warnings if w not in planned] + answered


def _pick_steps(stages: list[Stage], total: int, max_points: int, marks: list[int]) -> tuple[list[int], bool]:
    if total <= max_points:
        return list(range(total)), False
    # Where the batch changes or warmup ends is where a chart bends: keep those steps (and the
    # one before each), up to a quarter of the points, and spread the rest evenly.
    edges = {s.first_step for s in stages} | {s.first_step - 1 for s in stages if s.first_step} | set(marks)
    kept = sorted(e for e in edges if 0 <= e < total)[: max_points // 4]
    spread = max(max_points - len(kept), 2)
    even = {round(i * (total - 1) / (spread - 1)) for i in range(spread)}
    return sorted(even | set(kept)), True


# Over 60 lines: the run's stages, points and warnings come from one walk over the ramp and the
# lr; the walk's state is shared by all three.
def schedule(plan: Plan, spec: ScheduleSpec) -> Schedule:
    if not 2 <= spec.max_points <= MAX_POINTS:
        raise InvalidValue(f"max_points must be from 2 to {MAX_POINTS}", pointer="/max_points")
    steps = spec.train_steps
    if steps is None and plan.learning_rate is not None:
        steps = plan.learning_rate.train_steps
    if steps is None:
        steps = plan.sampler.total_optimizer_steps if plan.sampler else None
        if steps is None:
            raise InvalidValue(
                "give train_steps (or plan.learning_rate.train_steps), or plan.dataset with epochs so "
                "the run length can be counted",
                pointer="/train_steps",
            )
    if not 1 <= steps <= MAX_SAFE_INTEGER:
        raise InvalidValue(f"train_steps must be from 1 to {MAX_SAFE_INTEGER}", pointer="/train_steps")
    if spec.rampup is not None and plan.split != "even":
        raise InvalidValue(
            "ramp-up needs an even split: a proportional (mixed-cluster) plan fixes each replica's "
            "share of one global batch",
            pointer="/rampup",
        )
    if spec.rampup is not None:
        stages = _ramp_stages(plan, spec.rampup, steps)
    else:
        stages = [Stage(0, steps, plan.global_batch_size, plan.gradient_accumulation_steps)]
    lr_plan = plan.learning_rate
    if lr_plan is not None:
        lr_plan = recipe_for(lr_plan, spec, steps)
    warnings = _plan_warnings(plan, lr_plan)
    warmup = lr_plan.warmup_steps if lr_plan else 0
    ramp_steps = sum(s.steps for s in stages if s.global_batch_size != plan.global_batch_size)
    if spec.rampup is not None and ramp_steps >= steps:
        warnings.append(f"the run ends during ramp-up: the batch never reaches {plan.global_batch_size}")

    starts = [s.first_step for s in stages]
    consumed_before = [0]
    for s in stages:
        consumed_before.append(consumed_before[-1] + s.steps * s.global_batch_size)
    picked, downsampled = _pick_steps(stages, steps, spec.max_points, [warmup] if warmup else [])
    points = []
    for step in picked:
        i = bisect.bisect_right(starts, step) - 1
        stage = stages[i]
        lr = lr_of(lr_plan, step) if lr_plan is not None else None
        points.append(
            SchedulePoint(
                step=step,
                consumed_samples=consumed_before[i] + (step - stage.first_step) * stage.global_batch_size,
                global_batch_size=stage.global_batch_size,
                gradient_accumulation_steps=stage.gradient_accumulation_steps,
                lr=lr,
            )
        )
    return Schedule(
        train_steps=steps,
        train_samples=consumed_before[-1],
        rampup_steps=ramp_steps,
        warmup_steps=warmup,
        peak_lr=lr_plan.lr if lr_plan else None,
        min_lr=lr_plan.min_lr if lr_plan else None,
        decay=lr_plan.decay if lr_plan else (spec.decay or Decay.CONSTANT).value,
        stages=tuple(stages),
        points=tuple(points),
        downsampled=downsampled,
        warnings=tuple(warnings),
        warmup_start_lr=lr_plan.warmup_start_lr if lr_plan else None,
        milestones=lr_plan.milestones if lr_plan else (),
        schedule=lr_plan.schedule if lr_plan else None,
    )
