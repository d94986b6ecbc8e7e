"""A split timed by the measured curves: the plan's `throughput` (its predicted step, its idle
fraction, and the same for the even split, the split by peak samples/s and the split at the
fewest accumulation steps), each replica group's predicted micro-step, and the warnings about
micro-batches outside the measured points."""

from __future__ import annotations

import math
from collections.abc import Iterable

from app.core.cluster.topology import ReplicaLayout
from app.core.records.integers import ceil_div, smallest_divisor_at_least
from app.core.records.plan import SplitPrediction, ThroughputPlan
from app.core.records.throughput_curve import StepTime
from app.core.split.batch_problem import BatchProblem, BatchSolution
from app.core.split.curve_split import curve_split
from app.core.split.proportional import capped_layout
from app.core.split.shares import Share, proportional_shares

_MAX_LISTED = 4


class Timing:
    """Predicted micro-step times of a layout's replicas (ReplicaLayout.step_times)."""

    def __init__(self, layout: ReplicaLayout) -> None:
        self.layout = layout
        self.times = layout.step_times
        # (StepTime's id, micro-batch) -> time: a cluster of a few GPU kinds asks the same
        # few thousand times (the split, the comparisons, every replica group).
        self._memo: dict[tuple[int, int], float] = {}

    def of(self, segment: int) -> StepTime:
        time = self.times[segment]
        assert time is not None
        return time

    def at(self, segment: int, samples: int) -> float:
        """The predicted micro-step of `samples` on the segment's replicas."""
        time = self.of(segment)
        key = (id(time), samples)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = time.at(samples)
        return found

    def predict(self, shares: list[Share] | tuple[Share, ...], accumulation: int) -> SplitPrediction:
        slowest, busy, replicas = 0.0, 0.0, 0
        for share in shares:
            t = self.at(share.segment, share.samples)
            n = share.stop - share.start
            slowest = max(slowest, t)
            busy += n * t
            replicas += n
        idle = 1 - busy / (replicas * slowest) if slowest > 0 else 0.0
        return SplitPrediction(accumulation, accumulation * slowest, slowest, max(idle, 0.0))


def throughput_plan(problem: BatchProblem, solution: BatchSolution) -> tuple[ThroughputPlan, Timing]:
    """The solution's split timed, beside the splits it was chosen over, at its global batch."""
    layout = capped_layout(problem)
    timing = Timing(layout)
    G, g = solution.global_batch_size, solution.gradient_accumulation_steps
    chosen = timing.predict(solution.shares, g)
    total = G // g
    segments = layout.segments
    peaks: dict[int, float] = {}  # by StepTime, one per distinct curve
    for i in range(len(segments)):
        time = timing.of(i)
        if id(time) not in peaks:
            # 24 significant bits: the comparison's weights stay small integers
            # (app.core.split.shares scales every weight to one binary denominator).
            mantissa, exponent = math.frexp(time.peak_samples_per_s)
            peaks[id(time)] = math.ldexp(round(mantissa * 2**24), exponent - 24)
    peak = [peaks[id(timing.of(i))] for i in range(len(segments))]
    return (
        ThroughputPlan(
            predicted_step_s=chosen.predicted_step_s,
            predicted_micro_step_s=chosen.predicted_micro_step_s,
            idle_fraction=chosen.idle_fraction,
            even=timing.predict(proportional_shares(total, segments, [1.0] * len(segments)), g),
            proportional=timing.predict(proportional_shares(total, segments, peak), g),
            fewest_accumulation=_fewest(problem, solution, layout, timing, chosen),
            extrapolated=bool(outside_measured(layout, solution.shares, timing)),
        ),
        timing,
    )


def _fewest(
    problem: BatchProblem,
    solution: BatchSolution,
    layout: ReplicaLayout,
    timing: Timing,
    chosen: SplitPrediction,
) -> SplitPrediction:
    """The split at the fewest accumulation steps that fit: the largest micro-batches, what the
    plan would take without curves."""
    if problem.gradient_accumulation_steps is not None or problem.micro_batch_size is not None:
        return chosen  # the request fixed the accumulation
    G, D = solution.global_batch_size, layout.data_parallel_size
    if solution.even:
        per_replica, cap = G // D, layout.uniform_cap
        g = smallest_divisor_at_least(per_replica, ceil_div(per_replica, cap) if cap else 1)
        assert g is not None
        shares = [Share(i, s.start, s.stop, per_replica // g) for i, s in enumerate(layout.segments)]
        return timing.predict(shares, g)
    C = layout.capacity
    g = smallest_divisor_at_least(G, ceil_div(G, C) if C else 1, G // D)
    assert g is not None
    if g == solution.gradient_accumulation_steps:
        return chosen
    return timing.predict(curve_split(layout).split(G // g)[0], g)


def outside_measured(
    layout: ReplicaLayout, shares: tuple[Share, ...], timing: Timing
) -> list[tuple[str, int, int, str]]:
    """(node group, micro-batch, nearest measured, "above" or "below") for each share whose
    micro-batch lies outside its curve's measured points."""
    out = []
    for share in shares:
        segment = layout.segments[share.segment]
        time = timing.of(share.segment)
        if share.samples > time.last_size:
            out.append((segment.node_group, share.samples, time.last_size, "above"))
        elif share.samples < time.first_size:
            out.append((segment.node_group, share.samples, time.first_size, "below"))
    return out


def curve_warnings(layout: ReplicaLayout, shares: tuple[Share, ...], timing: Timing) -> list[str]:
    """Where a prediction rests on more than the measured points: micro-batches outside them,
    and points measured faster than a smaller micro-batch (kept at the smaller one's time)."""
    out = []
    outside = outside_measured(layout, shares, timing)
    above = [(n, b, m) for n, b, m, side in outside if side == "above"]
    below = [(n, b, m) for n, b, m, side in outside if side == "below"]
    if above:
        out.append(
            "micro-batches past the largest measured point are predicted at that point's samples/s: "
            + _listed(f"{n} takes {b}, measured up to {m}" for n, b, m in above)
            + "; measure the curve up to the micro-batch the plan gives (POST /v1/checks with "
            "throughput.micro_batch_sizes) to know"
        )
    if below:
        out.append(
            "micro-batches below the smallest measured point are predicted no faster than it: "
            + _listed(f"{n} takes {b}, measured from {m}" for n, b, m in below)
            + "; add smaller micro-batches to the curve to know"
        )
    noisy = sorted(
        {s.node_group for s, t in zip(layout.segments, timing.times, strict=True) if t and t.slower_points}
    )
    if noisy:
        out.append(
            "a measured micro-step is shorter than a smaller micro-batch's in the curves of "
            + _listed(noisy)
            + " (measurement noise?): the smaller one's time is kept there, so that a larger "
            "micro-batch is never predicted faster; remeasure with more repeats"
        )
    return out


def _listed(items: Iterable[str]) -> str:
    names = list(items)
    more = f", and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else ""
    return ", ".join(map(str, names[:_MAX_LISTED])) + more
