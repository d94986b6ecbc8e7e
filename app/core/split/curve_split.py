"""The split from measured curves: one micro-step's samples shared out so that the slowest
replica's predicted micro-step time (app.core.records.throughput_curve) is as short as it can be, and
the accumulation count whose step (accumulation x that time) is the shortest.

Replicas are pooled by (curve, cap), as the proportional split pools them by (weight, cap): a
cluster of 10,000 node groups of a few GPU kinds has a few pools. For M samples per micro-step:

1. the continuous relaxation: each pool's B(T), the most samples a replica takes within time T,
   is piecewise linear in T (StepTime.knots); their sum, swept once over the sorted knots, gives
   the T at which the pools hold M samples. It is a lower bound of the whole-number optimum;
2. every pool at the whole-number B(T) just below that T (at most M samples in all), then the
   remaining samples by water-filling: the pool whose next sample costs the least time takes
   it, a level of all its replicas at a time (up to where another pool's next sample is
   cheaper), and the last level is shared out over the pool's replicas in rank order.

Water-filling from below an optimum is exact for a non-decreasing t (the slowest replica's time
is the last level handed out, and no split of the same samples can avoid it), and the split is
the same whatever order the pools are listed in, up to ties.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from itertools import accumulate

from app.core.cluster.topology import ReplicaLayout
from app.core.records.integers import divisors
from app.core.records.throughput_curve import StepTime
from app.core.split.shares import Share

_TIE = 1e-9  # relative: accumulation counts whose predicted steps differ less are a tie


class _Pool:
    __slots__ = ("cap", "count", "segments", "time")

    def __init__(self, time: StepTime, cap: int | None) -> None:
        self.time, self.cap, self.count = time, cap, 0
        self.segments: list[int] = []


class CurveSplit:
    """The min-max split over a layout's segments, each with a curve, for any micro-step total."""

    def __init__(self, layout: ReplicaLayout) -> None:
        self.segments = layout.segments
        pools: dict[tuple[int, int | None], _Pool] = {}
        # ReplicaLayout.step_times holds one StepTime per distinct curve: pooled by its identity.
        for i, (s, time) in enumerate(zip(layout.segments, layout.step_times, strict=True)):
            assert time is not None
            pool = pools.get((id(time), s.cap))
            if pool is None:
                pool = pools[(id(time), s.cap)] = _Pool(time, s.cap)
            pool.count += s.stop - s.start
            pool.segments.append(i)
        self.pools = list(pools.values())
        self.replicas = sum(p.count for p in self.pools)
        self._solved: dict[int, tuple[list[int], list[int], float]] = {}
        self._sweep()

    def _sweep(self) -> None:
        """The relaxation's sum as a line A + C*T between consecutive knot times: the changes
        of A and C at every knot, sorted by time and summed up (flat lists: 10,000 curves make
        some 100,000 knots)."""
        times: list[float] = []
        changes_a: list[float] = []
        changes_c: list[float] = []
        for pool in self.pools:
            knots, tail = pool.time.knots(pool.cap)
            n = pool.count
            a, c = 1.0, 0.0  # every replica holds one sample below its first knot
            last = len(knots) - 1
            for k, (t0, b0) in enumerate(knots):
                if k < last:
                    t1, b1 = knots[k + 1]
                    if t1 == t0:
                        continue  # a jump: the next piece starts at b1, at the same time
                    slope = (b1 - b0) / (t1 - t0)
                else:
                    slope = tail
                new_a = b0 - slope * t0
                times.append(t0)
                changes_a.append(n * (new_a - a))
                changes_c.append(n * (slope - c))
                a, c = new_a, slope
        order = sorted(range(len(times)), key=times.__getitem__)
        self._at = [times[i] for i in order]
        self._a = list(accumulate([changes_a[i] for i in order], initial=float(self.replicas)))[1:]
        self._c = list(accumulate([changes_c[i] for i in order], initial=0.0))[1:]
        # The relaxation's total just after each knot: non-decreasing, each pool's B(T) being so.
        self._held = [a + c * t for a, c, t in zip(self._a, self._c, self._at, strict=True)]

    def relaxed_time(self, total: int) -> float:
        """The least T at which the continuous relaxation holds `total` samples."""
        if total <= self.replicas:
            return 0.0
        k = bisect_left(self._held, total)
        if k == len(self._held):
            c = self._c[-1]
            return self._at[-1] + (total - self._held[-1]) / c if c > 0 else math.inf
        if k == 0:
            return self._at[0]
        c = self._c[k - 1]
        if c > 0:
            return min(self._at[k - 1] + (total - self._held[k - 1]) / c, self._at[k])
        return self._at[k]

    def split(self, total: int) -> tuple[list[Share], float]:
        """Each replica's samples (at most two shares per segment) and the slowest time."""
        levels, extra, slowest = self._solve(total)
        return self._shares(levels, extra), slowest

    def slowest(self, total: int) -> float:
        """The least possible slowest micro-step for `total` samples."""
        return self._solve(total)[2]

    def _solve(self, total: int) -> tuple[list[int], list[int], float]:
        """Each pool's level, how many of its replicas take one more, and the slowest time;
        remembered, as the accumulation search, the split and the plan's comparison ask again."""
        solved = self._solved.get(total)
        if solved is None:
            solved = self._solved[total] = self._solve_anew(total)
        return solved

    def _solve_anew(self, total: int) -> tuple[list[int], list[int], float]:
        limit = self.relaxed_time(total)
        levels = self._levels_within(limit)
        held = sum(p.count * b for p, b in zip(self.pools, levels, strict=True))
        step = max(abs(limit), 1e-300) * 1e-12
        while held > total:  # the float relaxation landed a hair above the optimum
            limit -= step
            step *= 4
            levels = self._levels_within(limit)
            held = sum(p.count * b for p, b in zip(self.pools, levels, strict=True))
        extra = self._fill(levels, total - held)
        slowest = max(
            p.time.at(b + (1 if e else 0)) for p, b, e in zip(self.pools, levels, extra, strict=True)
        )
        return levels, extra, slowest

    def _levels_within(self, limit: float) -> list[int]:
        return [max(p.time.most_within(limit, p.cap), 1) for p in self.pools]

    def _fill(self, levels: list[int], left: int) -> list[int]:
        """Water-filling of `left` samples onto `levels` (changed in place); returns how many
        replicas of each pool take one sample above its level."""
        extra = [0] * len(self.pools)
        heap = [
            (p.time.at(b + 1), i)
            for i, (p, b) in enumerate(zip(self.pools, levels, strict=True))
            if p.cap is None or b < p.cap
        ]
        heapq.heapify(heap)
        while left > 0:
            _, i = heapq.heappop(heap)
            pool, level = self.pools[i], levels[i]
            if heap:
                top = max(pool.time.most_within(heap[0][0], pool.cap), level + 1)
            else:
                top = pool.cap if pool.cap is not None else level + -(-left // pool.count)
            if pool.count * (top - level) <= left:
                left -= pool.count * (top - level)
                levels[i] = top
                if pool.cap is None or top < pool.cap:
                    heapq.heappush(heap, (pool.time.at(top + 1), i))
            else:
                levels[i] += left // pool.count
                extra[i] = left % pool.count
                left = 0
        return extra

    def _shares(self, levels: list[int], extra: list[int]) -> list[Share]:
        per_segment: list[tuple[int, int]] = [(0, 0)] * len(self.segments)  # (level, replicas above)
        for pool, level, above in zip(self.pools, levels, extra, strict=True):
            left = above  # the pool's replicas one sample above its level, first ranks first
            for i in pool.segments:
                s = self.segments[i]
                take = min(left, s.stop - s.start)
                per_segment[i] = (level, take)
                left -= take
        shares: list[Share] = []
        for i, (s, (level, above)) in enumerate(zip(self.segments, per_segment, strict=True)):
            if above:
                shares.append(Share(i, s.start, s.start + above, level + 1))
            if above < s.stop - s.start:
                shares.append(Share(i, s.start + above, s.stop, level))
        return shares


def curve_split(layout: ReplicaLayout) -> CurveSplit:
    """The split from `layout`'s curves, built once per layout (the accumulation search, the
    split and the plan's comparisons all ask it), kept beside the layout's own cached values."""
    built: CurveSplit | None = layout.__dict__.get("curve_split")
    if built is None:
        built = layout.__dict__["curve_split"] = CurveSplit(layout)
    return built


def best_accumulation(split: CurveSplit, global_batch: int, low: int, high: int) -> int:
    """The accumulation g in [low, high] dividing the global batch whose predicted step,
    g x the slowest micro-step of the best split of global_batch / g, is the shortest (ties:
    the fewest micro-steps). The relaxation bounds each count from below, so only the counts
    whose bound can still win are split exactly."""
    candidates = [g for g in divisors(global_batch) if low <= g <= high]
    bounds = sorted((g * split.relaxed_time(global_batch // g), g) for g in candidates)
    best_g, best = candidates[0], math.inf
    for bound, g in bounds:
        if bound * (1 - _TIE) > best:
            break
        step = g * split.slowest(global_batch // g)
        if step < best * (1 - _TIE) or (step <= best * (1 + _TIE) and g < best_g):
            best_g, best = g, step
    return best_g


def fastest_even_accumulation(layout: ReplicaLayout, per_replica: int, fewest: int) -> int:
    """On an even split from one curve (every replica alike), the accumulation g dividing each
    replica's samples per step, at least `fewest` (the cap's), whose step g x t(per_replica / g)
    is the shortest; ties: the fewest micro-steps. Without a curve, `fewest`."""
    time = layout.step_times[0]
    if time is None:
        return fewest
    best_g, best = fewest, fewest * time.at(per_replica // fewest)
    for g in divisors(per_replica):
        if g > fewest:
            step = g * time.at(per_replica // g)
            if step < best * (1 - _TIE):
                best_g, best = g, step
    return best_g
