"""Share one micro-step's samples out over replicas in proportion to throughput.

Each replica gets clamp(mu * w, 1, cap) samples for the one mu that makes the total come
out right (water-filling), then whole numbers by largest remainder, ties to the lower
rank. All arithmetic is on integers: throughputs are floats, and each float is an exact
binary fraction, so scaling them to one common denominator loses nothing and makes ties
real ties rather than rounding accidents. Work is O(segments log segments), independent
of how many replicas a segment holds.
"""

from __future__ import annotations

from fractions import Fraction

from app.core.cluster.topology import Segment
from app.core.records.record import record


@record
class Share:
    """Replicas [start, stop) of segment `segment` each take `samples` per micro-step."""

    segment: int
    start: int
    stop: int
    samples: int


def _integer_weights(throughputs: list[float]) -> list[int]:
    ratios = [t.as_integer_ratio() for t in throughputs]
    denominator = max(q for _, q in ratios)  # all are powers of two
    return [p * (denominator // q) for p, q in ratios]


def _solve_mu(total: int, segments: tuple[Segment, ...], weights: list[int]) -> tuple[int, int]:
    """mu as (numerator, denominator) at which sum(count * clamp(mu * w, 1, cap)) == total.

    A sweep over the breakpoints mu = 1/w, where a replica leaves its floor, and cap/w,
    where it hits its cap. mu depends only on how many replicas share each (weight, cap),
    so replicas are pooled by that pair first: a cluster of 10,000 node groups has only
    as many events as it has distinct GPU kinds. Comparisons stay in integers.
    """
    pooled: dict[tuple[int, int | None], int] = {}
    for s, w in zip(segments, weights, strict=True):
        pooled[(w, s.cap)] = pooled.get((w, s.cap), 0) + s.count
    # (float for ordering, numerator, denominator, kind, weight, cap, count)
    events: list[tuple[float, int, int, int, int, int | None, int]] = []
    for (w, cap), count in pooled.items():
        events.append((1 / w, 1, w, 0, w, cap, count))
        if cap is not None:
            events.append((cap / w, cap, w, 1, w, cap, count))
    # Correctly rounded floats never invert an order; equal floats are ordered exactly.
    events.sort(key=lambda e: (e[0], e[3]))
    run = 0
    for i in range(1, len(events) + 1):
        if i == len(events) or events[i][0] != events[run][0]:
            if i - run > 1:
                events[run:i] = sorted(events[run:i], key=lambda e: (Fraction(e[1], e[2]), e[3]))
            run = i
    fixed = sum(pooled.values())  # samples held at a bound (every replica starts at 1)
    slope = 0  # sum of count * w over replicas strictly between their bounds
    for _, num, den, kind, w, cap, count in events:
        if slope and fixed * den + num * slope >= total * den:
            return total - fixed, slope
        if kind == 0:
            fixed -= count
            slope += count * w
        else:
            slope -= count * w
            fixed += count * (cap or 0)
    if slope:
        return total - fixed, slope
    # Every replica at its cap (total == capacity): any mu past the last breakpoint.
    return events[-1][1], events[-1][2]


def proportional_shares(
    total: int, segments: tuple[Segment, ...], throughputs: list[float] | None = None
) -> list[Share]:
    """Whole per-replica sample counts that add up to `total`; needs
    replicas <= total <= sum of caps. Returns at most two shares per segment. `throughputs`:
    each segment's weight instead of its own throughput."""
    counts = [s.stop - s.start for s in segments]
    caps = [s.cap for s in segments]
    replicas = sum(counts)
    capacity = None if None in caps else sum(n * (c or 0) for n, c in zip(counts, caps, strict=True))
    if not replicas <= total <= (capacity if capacity is not None else total):
        raise ValueError(f"{total} samples cannot give {replicas} replicas 1..cap each")
    weights = _integer_weights(throughputs or [s.throughput for s in segments])
    num, den = _solve_mu(total, segments, weights)

    base: list[int] = []
    # (-remainder, segment) of each segment with a remainder (a numerator over the common
    # denominator `den`): sorted, the largest remainder first, ties to the lower rank.
    by_remainder: list[tuple[int, int]] = []
    leftover = total
    for i, (n, cap, w) in enumerate(zip(counts, caps, weights, strict=True)):
        q, r = divmod(num * w, den)
        if q < 1:
            q, r = 1, 0
        elif cap is not None and q >= cap:
            q, r = cap, 0
        base.append(q)
        leftover -= n * q
        if r:
            by_remainder.append((-r, i))
    by_remainder.sort()

    extra = [0] * len(segments)
    for _, i in by_remainder:
        if leftover <= 0:
            break
        extra[i] = min(counts[i], leftover)
        leftover -= extra[i]
    if leftover:
        raise AssertionError("largest-remainder rounding did not place every sample")

    shares: list[Share] = []
    for i, s in enumerate(segments):
        if extra[i]:
            shares.append(Share(i, s.start, s.start + extra[i], base[i] + 1))
        if extra[i] < counts[i]:
            shares.append(Share(i, s.start + extra[i], s.stop, base[i]))
    return shares
