"""Where the steps of an epoch lie in the epoch's order, whatever the number of replicas: the
arithmetic that makes a resume on another data-parallel size exact, and the test of when it is.

torch's DistributedSampler gives rank r of W the positions r, r + W, r + 2W, ... of the epoch's
index list (the seed + epoch permutation, padded by repeating it from the start or cut for
drop_last to total_size). One micro-step of all ranks, micro-batch m each, reads the
contiguous positions [k m W, (k + 1) m W), so optimizer step t reads [t B, (t + 1) B) as a set,
B = m x accumulation x W, for every W that keeps B; the proportional sampler lays its
micro-steps out the same way. Only where an epoch ends depends on W: padding to a multiple of
W (or drop_last's cut), the short last micro-batch, and the leftover micro-steps the plan
drops. `epoch_tail` says where each plan's epoch ends; `tail_difference` whether a resumed run
sees the uninterrupted run's global batches from a step to the run's end.
"""

from __future__ import annotations

from app.core.records.plan import Plan, SamplerPlan
from app.core.records.resume import EpochTail


def epoch_tail(plan: Plan) -> EpochTail:
    """The plan's epoch: its whole optimizer steps and the end of the last one. Step k < S - 1
    reads the full block [k B, (k + 1) B); the last reads [(S - 1) B, min(S B, total_size)),
    short when the epoch's last micro-step is (an even split's short micro-batch)."""
    assert plan.sampler is not None
    return sampler_tail(plan.global_batch_size, plan.sampler)


def sampler_tail(batch: int, sampler: SamplerPlan) -> EpochTail:
    """`epoch_tail` of a plan with this global batch and sampler."""
    steps = sampler.optimizer_steps_per_epoch
    return EpochTail(
        optimizer_steps=steps,
        last_step_end=min(steps * batch, sampler.total_size),
        total_size=sampler.total_size,
        padded_samples=sampler.padded_samples,
        dropped_samples=sampler.dropped_samples,
    )


def step_block(tail: EpochTail, batch: int, step: int) -> tuple[int, int] | None:
    """The positions [start, end) of the epoch's order that step `step` reads; None past the
    epoch's last whole step."""
    if step >= tail.optimizer_steps:
        return None
    return step * batch, min((step + 1) * batch, tail.last_step_end)


def describe(tail: EpochTail, replicas: int) -> str:
    how = (
        f"DistributedSampler pads the epoch to {tail.total_size} samples"
        if tail.padded_samples
        else f"drop_last cuts the epoch to {tail.total_size} samples"
        if tail.dropped_samples
        else f"the epoch holds {tail.total_size} samples"
    )
    return (
        f"on {replicas} replica{'s' if replicas != 1 else ''} {how} and runs {tail.optimizer_steps} whole "
        f"optimizer steps, the last ending at position {tail.last_step_end}"
    )


def tail_difference(
    old: EpochTail, new: EpochTail, batch: int, first: int, last: int | None
) -> tuple[int, int] | None:
    """Whether the steps of the epoch from `first` on read the same positions under `new` as
    under `old`, to the epoch's step `last` (the run ends there) or, with `last` None, through
    every later epoch as well (the run goes on past this epoch). None when they all do; else
    the first step (in the epoch) that differs and the epoch it is in (0: this one, 1: a later
    one)."""
    if last is None:
        if (old.optimizer_steps, old.last_step_end) == (new.optimizer_steps, new.last_step_end):
            return None
        # The first step whose block differs, in this epoch if it lies ahead, else the next.
        for epoch, start in ((0, first), (1, 0)):
            for step in sorted({old.optimizer_steps - 1, new.optimizer_steps - 1, old.optimizer_steps}):
                if step >= start and step_block(old, batch, step) != step_block(new, batch, step):
                    return step, epoch
        return first, 0  # unreachable: differing tails differ at one of those steps
    for step in sorted({last, old.optimizer_steps - 1, new.optimizer_steps - 1}):
        if first <= step <= last and step_block(old, batch, step) != step_block(new, batch, step):
            return step, 0
    return None
