"""A resume in a schedule (POST /v1/plans/schedule with the plan's `resume`): under a ramp-up,
by consumed samples, as Megatron counts and checkpoints them (`consumed_train_samples`).

The ramp's global batch is a function of the samples consumed (app.core.learning_rate.schedule.MegatronRamp),
so a step is found from them: consumed samples must land between two steps. Megatron's
`MegatronPretrainingSampler` reads the micro-batches of every step from the block of the data
that starts at the consumed samples, rank by rank, whatever the data-parallel size: resumed on
another size, every later step reads the same samples as long as the micro-batch times the new
data-parallel size divides every stage's batch (else Megatron refuses the ramp, and so does
this, at the field). Without a ramp-up the schedule's resume is the plan's (app.core.resume.plan_resume).
"""

from __future__ import annotations

import dataclasses
import math

from app.core.errors.domain import InvalidValue
from app.core.learning_rate.recipe_summary import lr_of
from app.core.learning_rate.schedule import recipe_for
from app.core.records.integers import divisors, nearest
from app.core.records.plan import Plan
from app.core.records.resume import ResumeSpec, ScheduleResume
from app.core.records.schedule import Schedule, ScheduleSpec, Stage

_AT = "/plan/resume/"


def _starts(stages: tuple[Stage, ...]) -> list[int]:
    """The samples consumed before each stage."""
    out, consumed = [], 0
    for s in stages:
        out.append(consumed)
        consumed += s.steps * s.global_batch_size
    return [*out, consumed]


def _step(stages: tuple[Stage, ...], consumed: int) -> tuple[int, Stage]:
    starts = _starts(stages)
    for stage, first in zip(stages, starts, strict=False):
        end = first + stage.steps * stage.global_batch_size
        if first <= consumed < end:
            offset, rest = divmod(consumed - first, stage.global_batch_size)
            if rest:
                below = first + offset * stage.global_batch_size
                step = stage.first_step + offset
                raise InvalidValue(
                    f"resume.consumed_samples {consumed} falls inside optimizer step {step} of the ramp "
                    f"(global batch {stage.global_batch_size}): a checkpoint is taken between steps",
                    pointer=_AT + "consumed_samples",
                    suggestions={"resume.consumed_samples": [below, below + stage.global_batch_size]},
                )
            return stage.first_step + offset, stage
    last = stages[-1]
    final = starts[-1] - last.global_batch_size
    raise InvalidValue(
        f"resume.consumed_samples {consumed} is past the run's end: its {last.first_step + last.steps} "
        f"optimizer steps consume {starts[-1]} samples, and the last step starts at {final}",
        pointer=_AT + "consumed_samples",
        suggestions={"resume.consumed_samples": [final]},
    )


def _replicas(plan: Plan, stages: tuple[Stage, ...], spec: ResumeSpec) -> int:
    """The data-parallel size the run goes on with: every stage in whole micro-batches there."""
    replicas = spec.data_parallel_size or plan.data_parallel_size
    micro = plan.micro_batch_size
    assert micro is not None  # a ramp-up needs an even split (app.core.learning_rate.schedule)
    common = math.gcd(*(s.global_batch_size for s in stages))
    if common % (micro * replicas):
        fits = divisors(common // micro) if common % micro == 0 else []
        raise InvalidValue(
            f"on {replicas} replicas the ramp's batches {sorted({s.global_batch_size for s in stages})} do "
            f"not split into whole micro-batches of {micro} (Megatron keeps --micro-batch-size and refuses "
            f"such a ramp)",
            pointer=_AT + "data_parallel_size",
            suggestions={"resume.data_parallel_size": nearest(fits, replicas)} if fits else {},
        )
    return replicas


def ramp_resume(plan: Plan, result: Schedule, spec: ScheduleSpec, resume: ResumeSpec) -> ScheduleResume:
    """The resume of a ramp-up run, by consumed samples."""
    if resume.consumed_samples is None:
        at = resume.optimizer_step
        consumed = [
            first + (at - s.first_step) * s.global_batch_size
            for s, first in zip(result.stages, _starts(result.stages), strict=False)
            if at is not None and s.first_step <= at < s.first_step + s.steps
        ]
        raise InvalidValue(
            "a ramp-up run resumes by consumed samples (its batch follows them, and Megatron checkpoints "
            "them): give resume.consumed_samples"
            + (f" ({consumed[0]} before optimizer step {at})" if consumed else ""),
            pointer=_AT + ("optimizer_step" if at is not None else "consumed_samples"),
            suggestions={"resume.consumed_samples": consumed} if consumed else {},
        )
    step, stage = _step(result.stages, resume.consumed_samples)
    replicas = _replicas(plan, result.stages, resume)
    micro = plan.micro_batch_size
    assert micro is not None
    lr = None
    if plan.learning_rate is not None:
        lr = lr_of(recipe_for(plan.learning_rate, spec, result.train_steps), step)
    return ScheduleResume(
        optimizer_step=step,
        consumed_samples=resume.consumed_samples,
        global_batch_size=stage.global_batch_size,
        data_parallel_size=replicas,
        micro_batch_size=micro,
        gradient_accumulation_steps=stage.global_batch_size // (micro * replicas),
        skip_micro_batches=resume.consumed_samples // (micro * replicas),
        lr=lr,
        remaining_steps=result.train_steps - step,
        same_global_batches=True,
        why=None,
        epoch=None,
        step_in_epoch=None,
    )


def with_resume(result: Schedule, plan: Plan, spec: ScheduleSpec, resume: ResumeSpec | None) -> Schedule:
    """The schedule with its resume: the ramp's, or without one the plan's own."""
    if resume is None:
        return result
    if spec.rampup is not None:
        found = ramp_resume(plan, result, spec, resume)
        note = (
            "resumed by consumed samples, as Megatron's checkpoint stores them: its 'single' sampler "
            "(MegatronPretrainingSampler) starts there on any data-parallel size; its 'cyclic' sampler "
            "(MegatronPretrainingRandomSampler) ends an epoch at total - total % (micro x data-parallel "
            "size) samples and shards by data-parallel size, so on another size its later batches differ"
        )
        return dataclasses.replace(result, resume=found, warnings=(*result.warnings, note))
    r = plan.resume
    assert r is not None  # planned with the request's resume
    found = ScheduleResume(
        optimizer_step=r.optimizer_step,
        consumed_samples=r.consumed_samples,
        global_batch_size=plan.global_batch_size,
        data_parallel_size=r.data_parallel_size,
        micro_batch_size=r.micro_batch_size,
        gradient_accumulation_steps=r.gradient_accumulation_steps,
        skip_micro_batches=r.skip_micro_batches,
        lr=r.lr,
        remaining_steps=r.remaining_steps
        if r.remaining_steps is not None
        else result.train_steps - r.optimizer_step,
        same_global_batches=r.same_global_batches,
        why=r.why,
        epoch=r.epoch,
        step_in_epoch=r.step_in_epoch,
    )
    return dataclasses.replace(result, resume=found)
