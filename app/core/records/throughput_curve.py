"""Measured throughput curves and the micro-step time the planner predicts from them.

A curve is what `POST /v1/checks` with `throughput` measures on one data-parallel replica (with
model parallelism, one model-parallel group): samples per second at each micro-batch it ran.
Samples per second is not linear in the micro-batch (fixed costs dominate small batches, compute
or memory bandwidth large ones), so the planner works with the micro-step time t(b) = b / rate:

- at a measured micro-batch, the measured time;
- between two measured micro-batches, piecewise-linear in the step time (the straight line
  between the two measured times);
- below the smallest measured micro-batch, that micro-batch's time: a smaller micro-batch is
  never predicted faster than the smallest one measured (its fixed costs remain);
- above the largest measured micro-batch (up to the cap), the largest one's samples per second:
  the step time grows in proportion to the samples, the usual shape once a device is saturated.
  A plan that relies on this says so in a warning;
- never shorter for more samples: where a measured time is below a smaller micro-batch's (noise),
  the smaller one's time is kept, so that t is non-decreasing and a slowest replica is well
  defined. The plan warns about such a point.

Every prediction is made by `StepTime.at` in floats, the one function the split minimises and the
answer reports.
"""

from __future__ import annotations

import math
from bisect import bisect_right

from app.core.records.record import record


@record
class ThroughputCurve:
    """One replica's measured points, in the request's order: `micro_batch_sizes[i]` ran at
    `samples_per_s[i]`. Two tuples of numbers rather than a tuple of point records: a plan pools
    replicas by their curve, and hashing these is one C call where points would be one Python
    call each."""

    micro_batch_sizes: tuple[int, ...]
    samples_per_s: tuple[float, ...]


class StepTime:
    """t(b): the predicted micro-step time, in seconds, of one replica at micro-batch b."""

    __slots__ = ("_sizes", "_times", "first_size", "last_size", "last_time", "slower_points")

    def __init__(self, sizes: list[int], times: list[float]) -> None:
        self._sizes = sizes
        kept: list[float] = []
        slower: list[int] = []  # indices whose measured time was below a smaller micro-batch's
        for i, measured in enumerate(times):
            if kept and measured < kept[-1]:
                slower.append(i)
            kept.append(max(measured, kept[-1]) if kept else measured)
        self._times = kept
        self.first_size, self.last_size, self.last_time = sizes[0], sizes[-1], kept[-1]
        self.slower_points = tuple(slower)

    @classmethod
    def of(cls, curve: ThroughputCurve) -> StepTime:
        sizes = list(curve.micro_batch_sizes)
        return cls(sizes, [b / r for b, r in zip(sizes, curve.samples_per_s, strict=True)])

    def at(self, b: int) -> float:
        sizes, times = self._sizes, self._times
        if b <= sizes[0]:
            return times[0]
        if b >= self.last_size:
            # b / last_size first: exactly 1.0 at the last point, and monotone in b.
            return self.last_time * (b / self.last_size)
        i = bisect_right(sizes, b) - 1
        lo, hi = times[i], times[i + 1]
        # min(): a rounding in the line must not put b above the next measured time.
        return min(lo + (hi - lo) * ((b - sizes[i]) / (sizes[i + 1] - sizes[i])), hi)

    def most_within(self, limit: float, cap: int | None) -> int:
        """The largest b in [1, cap] with at(b) <= limit; 0 when even b = 1 takes longer."""
        sizes, times = self._sizes, self._times
        if limit < times[0]:
            return 0
        j = bisect_right(times, limit) - 1  # the last measured time within the limit
        if j == len(times) - 1:
            guess = math.floor(limit / self.last_time * self.last_size) if limit < math.inf else cap
            if guess is None:
                raise ValueError("an unbounded replica has no largest micro-batch")
        else:
            span = times[j + 1] - times[j]
            guess = sizes[j] + math.floor((limit - times[j]) / span * (sizes[j + 1] - sizes[j]))
        guess = max(guess, 1)
        if cap is not None:
            guess = min(guess, cap)
        return self._settle(guess, limit, cap)

    def _settle(self, guess: int, limit: float, cap: int | None) -> int:
        """The exact answer near a float guess, by the forward function itself."""
        steps = 0
        while guess > 1 and self.at(guess) > limit:
            guess -= 1
            steps += 1
            if steps > 64:
                return self._bisect(1, guess, limit)
        while (cap is None or guess < cap) and self.at(guess + 1) <= limit:
            guess += 1
            steps += 1
            if steps > 64:
                return self._bisect(guess, cap, limit)
        return guess if self.at(guess) <= limit else 0

    def _bisect(self, lo: int, hi: int | None, limit: float) -> int:
        """Largest b in [lo, hi] with at(b) <= limit, given at(lo) <= limit."""
        if hi is None:
            hi = lo * 2
            while self.at(hi) <= limit:
                lo, hi = hi, hi * 2
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.at(mid) <= limit:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def knots(self, cap: int | None) -> tuple[list[tuple[float, float]], float]:
        """b as a function of the time limit, B(T) (continuous, every replica taking at least
        1): knots (T, B), linear between them (equal T: a jump), and the slope dB/dT past the
        last one (0 at the cap). The planner's continuous relaxation sums these."""
        sizes, times = self._sizes, self._times
        points: list[tuple[float, float]] = [(times[0], 1.0)]
        for b, t in zip(sizes, times, strict=True):
            if cap is not None and b >= cap:
                prev_t, prev_b = points[-1]
                # where the line from the previous knot reaches the cap
                reach = prev_t if b == prev_b else prev_t + (t - prev_t) * (cap - prev_b) / (b - prev_b)
                points.append((reach, float(cap)))
                return points, 0.0
            points.append((t, float(b)))
        if cap is None:
            return points, self.last_size / self.last_time
        points.append((self.last_time * (cap / self.last_size), float(cap)))
        return points, 0.0

    @property
    def peak_samples_per_s(self) -> float:
        return max(b / t for b, t in zip(self._sizes, self._times, strict=True))


def slowest_of(a: ThroughputCurve, b: ThroughputCurve) -> ThroughputCurve:
    """The curve of a model-parallel block that spans two node groups: at every micro-batch
    either measured, the slower group's predicted time (the block runs at its slowest GPU's
    pace). Between those points it is at least as slow as each group's line."""
    times = (StepTime.of(a), StepTime.of(b))
    sizes = tuple(sorted(set(a.micro_batch_sizes) | set(b.micro_batch_sizes)))
    return ThroughputCurve(sizes, tuple(m / max(t.at(m) for t in times) for m in sizes))
