"""The split from measured curves: one micro-step's samples shared out so that the slowest
replica's predicted micro-step time (app.core.throughput_curve) is as short as it can be, and
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

from app.core.integers import divisors
from app.core.split import Share
from app.core.throughput_curve import Curve, StepTime
from app.core.topology import Layout, Segment

_TIE = 1e-9  # relative: accumulation counts whose predicted steps differ less are a tie


class _Pool:
    __slots__ = ("cap", "count", "segments", "time")

    def __init__(self, time: StepTime, cap: int | None) -> None:
        self.time, self.cap, self.count = time, cap, 0
        self.segments: list[int] = []


class CurveSplit:
    """The min-max split over `segments`, each with a curve, for any micro-step total."""

    def __init__(self, segments: tuple[Segment, ...], times: dict[Curve, StepTime] | None = None) -> None:
        self.segments = segments
        self.times = times if times is not None else {}
        pools: dict[tuple[Curve, int | None], _Pool] = {}
        for i, s in enumerate(segments):
            assert s.curve is not None
            pool = pools.get((s.curve, s.cap))
            if pool is None:
                time = self.times.get(s.curve)
                if time is None:
                    time = self.times[s.curve] = StepTime.of(s.curve)
                pool = pools[(s.curve, s.cap)] = _Pool(time, s.cap)
            pool.count += s.stop - s.start
            pool.segments.append(i)
        self.pools = list(pools.values())
        self.replicas = sum(p.count for p in self.pools)
        self._sweep()

    def _sweep(self) -> None:
        """The relaxation's sum as a line A + C*T between consecutive knot times."""
        events: list[tuple[float, float, float]] = []  # (T, change of A, change of C)
        for pool in self.pools:
            knots, tail = pool.time.knots(pool.cap)
            n = pool.count
            a, c = 1.0, 0.0  # every replica holds one sample below its first knot
            for k in range(len(knots)):
                t0, b0 = knots[k]
                if k + 1 < len(knots):
                    t1, b1 = knots[k + 1]
                    if t1 == t0:
                        continue  # a jump: the next piece starts at b1, at the same time
                    slope = (b1 - b0) / (t1 - t0)
                else:
                    slope = tail
                new_a, new_c = b0 - slope * t0, slope
                events.append((t0, n * (new_a - a), n * (new_c - c)))
                a, c = new_a, new_c
        events.sort()
        self._at: list[float] = []
        self._a: list[float] = []
        self._c: list[float] = []
        self._held: list[float] = []  # the relaxation's total at each knot time
        A, C = float(self.replicas), 0.0
        for i, (t, da, dc) in enumerate(events):
            A += da
            C += dc
            if i + 1 < len(events) and events[i + 1][0] == t:
                continue
            self._at.append(t)
            self._a.append(A)
            self._c.append(C)
            self._held.append(A + C * t)

    def relaxed_time(self, total: int) -> float:
        """The least T at which the continuous relaxation holds `total` samples."""
        if total <= self.replicas:
            return 0.0
        k = bisect_left(self._held, total)
        if k == len(self._held):
            a, c = self._a[-1], self._c[-1]
            return (total - a) / c if c > 0 else math.inf
        if k == 0:
            return self._at[0]
        a, c = self._a[k - 1], self._c[k - 1]
        if c > 0:
            return min((total - a) / c, self._at[k])
        return self._at[k]

    def split(self, total: int) -> tuple[list[Share], float]:
        """Each replica's samples (at most two shares per segment) and the slowest time."""
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
        return self._shares(levels, extra), slowest

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
        step = g * split.split(global_batch // g)[1]
        if step < best * (1 - _TIE) or (step <= best * (1 + _TIE) and g < best_g):
            best_g, best = g, step
    return best_g


def fastest_even_accumulation(layout: Layout, per_replica: int, fewest: int) -> int:
    """On an even split from one curve (every replica alike), the accumulation g dividing each
    replica's samples per step, at least `fewest` (the cap's), whose step g x t(per_replica / g)
    is the shortest; ties: the fewest micro-steps. Without a curve, `fewest`."""
    curve = layout.segments[0].curve
    if curve is None:
        return fewest
    time = StepTime.of(curve)
    best_g, best = fewest, fewest * time.at(per_replica // fewest)
    for g in divisors(per_replica):
        if g > fewest:
            step = g * time.at(per_replica // g)
            if step < best * (1 - _TIE):
                best_g, best = g, step
    return best_g
