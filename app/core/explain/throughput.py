"""The explanation's sentences about a split planned from measured throughput curves: why this
split and this accumulation, in the plan's own predicted times."""

from __future__ import annotations

from app.core.records.plan import ReplicaGroup, ThroughputPlan

_MAX_LISTED = 4


def _s(seconds: float) -> str:
    return f"{seconds:.4g} s"


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.3g}%"


def _faster(ours: float, theirs: float) -> str:
    if theirs <= ours:
        return "no slower"
    return f"{(1 - ours / theirs) * 100:.3g}% shorter"


def throughput_sentences(
    t: ThroughputPlan, global_batch: int, groups: tuple[ReplicaGroup, ...], one_curve: bool, fixed: bool
) -> list[str]:
    """`one_curve`: every replica has the same curve (and cap); `fixed`: the request gave the
    accumulation (or the micro-batch), so none was chosen."""
    g = t.even.gradient_accumulation_steps
    if one_curve and len({group.micro_batch_size for group in groups}) == 1:
        out = [
            f"The micro-batch is read off the measured throughput curve, not taken as the largest "
            f"that fits: samples per second changes with the micro-batch, and the curve (a straight "
            f"line in time between measured micro-batches) predicts a micro-step of "
            f"{groups[0].micro_batch_size} samples at {_s(t.predicted_micro_step_s)}."
        ]
    else:
        listed = ", ".join(
            f"{group.node_group} {group.micro_batch_size} in {_s(group.predicted_micro_step_s or 0.0)}"
            for group in groups[:_MAX_LISTED]
        )
        more = f", and {len(groups) - _MAX_LISTED} more groups" if len(groups) > _MAX_LISTED else ""
        out = [
            f"The split is planned from the measured throughput curves, not from a relative_throughput "
            f"guess: samples per second changes with the micro-batch, so each replica's micro-step "
            f"time is read off its own curve (a straight line in time between measured micro-batches) "
            f"and the samples are shared out so that the slowest replica's micro-step is as short as "
            f"it can be ({listed}{more}). The slowest takes {_s(t.predicted_micro_step_s)}, and the "
            f"others wait at the all-reduce for {_pct(t.idle_fraction)} of the step on average.",
            _against(t, global_batch, g),
        ]
    fewest = t.fewest_accumulation
    if fewest.gradient_accumulation_steps != g:
        out.append(
            f"Of the accumulation counts that keep the global batch of {global_batch}, {g} gives the "
            f"shortest predicted step, {g} x {_s(t.predicted_micro_step_s)} = {_s(t.predicted_step_s)}; "
            f"the largest micro-batches that fit (accumulation {fewest.gradient_accumulation_steps}) "
            f"would take {_s(fewest.predicted_step_s)}: samples per second peaks before memory "
            f"runs out."
        )
    else:
        out.append(
            f"A step is predicted to take {g} x {_s(t.predicted_micro_step_s)} = {_s(t.predicted_step_s)}"
            + (
                "."
                if fixed
                else "; no other accumulation count that keeps the global batch is predicted faster."
            )
        )
    return out


def _against(t: ThroughputPlan, global_batch: int, g: int) -> str:
    even, scalar = t.even, t.proportional
    return (
        f"For the same {global_batch // g} samples per micro-step, an even split would take "
        f"{_s(even.predicted_step_s)} per step (idle {_pct(even.idle_fraction)}), and a split in "
        f"proportion to each curve's peak samples per second, what one relative_throughput per group "
        f"can say, {_s(scalar.predicted_step_s)} (idle {_pct(scalar.idle_fraction)}): this split is "
        f"{_faster(t.predicted_step_s, even.predicted_step_s)} than the even one and "
        f"{_faster(t.predicted_step_s, scalar.predicted_step_s)} than the proportional one."
    )
