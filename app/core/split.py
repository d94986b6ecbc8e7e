"""Share one micro-step's samples out over replicas in proportion to throughput.

Each replica gets clamp(mu * w, 1, cap) samples for the one mu that makes the total come
out right (water-filling), then whole numbers by largest remainder, ties to the lower
rank. All arithmetic is on integers: throughputs are floats, and each float is an exact
binary fraction, so scaling them to one common denominator loses nothing and makes ties
real ties rather than rounding accidents. Work is O(segments log segments), independent
of how many replicas a segment holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from app.core.topology import Segment


@dataclass(frozen=True, slots=True)
class Share:
    """Replicas [start, stop) of segment `segment` each take `samples` per micro-step."""

    segment: int
    start: int
    stop: int
    samples: int


def _integer_weights(segments: tuple[Segment, ...]) -> list[int]:
    ratios = [s.throughput.as_integer_ratio() for s in segments]
    denominator = max(q for _, q in ratios)  # all are powers of two
    return [p * (denominator // q) for p, q in ratios]


def _solve_mu(total: int, segments: tuple[Segment, ...], weights: list[int]) -> Fraction:
    """The mu at which sum(count * clamp(mu * w, 1, cap)) == total (a sweep over the
    breakpoints mu = 1/w, where a replica leaves its floor, and cap/w, where it hits
    its cap)."""
    events: list[tuple[float, Fraction, int, int]] = []
    for i, (s, w) in enumerate(zip(segments, weights, strict=True)):
        events.append((1 / w, Fraction(1, w), 0, i))
        if s.cap is not None:
            events.append((s.cap / w, Fraction(s.cap, w), 1, i))
    # Correctly rounded floats never invert an order, so they sort; the exact value
    # only decides between equal floats.
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    fixed = sum(s.count for s in segments)  # samples held at a bound (all start at 1)
    slope = 0  # sum of count * w over replicas strictly between their bounds
    for _, mu, kind, i in events:
        if slope and fixed + mu * slope >= total:
            return (total - fixed) / Fraction(slope)
        s, w = segments[i], weights[i]
        if kind == 0:
            fixed -= s.count
            slope += s.count * w
        else:
            slope -= s.count * w
            fixed += s.count * (s.cap or 0)
    if slope:
        return (total - fixed) / Fraction(slope)
    # Every replica at its cap (total == capacity): any mu past the last breakpoint.
    return events[-1][1]


def proportional_shares(total: int, segments: tuple[Segment, ...]) -> list[Share]:
    """Whole per-replica sample counts that add up to `total`; needs
    replicas <= total <= sum of caps. Returns at most two shares per segment."""
    replicas = sum(s.count for s in segments)
    capacity = None if any(s.cap is None for s in segments) else sum(s.count * (s.cap or 0) for s in segments)
    if not replicas <= total <= (capacity if capacity is not None else total):
        raise ValueError(f"{total} samples cannot give {replicas} replicas 1..cap each")
    weights = _integer_weights(segments)
    mu = _solve_mu(total, segments, weights)
    num, den = mu.numerator, mu.denominator

    base: list[int] = []
    remainders: list[int] = []  # numerators over the common denominator `den`
    for s, w in zip(segments, weights, strict=True):
        q, r = divmod(num * w, den)
        if q < 1:
            q, r = 1, 0
        elif s.cap is not None and q >= s.cap:
            q, r = s.cap, 0
        base.append(q)
        remainders.append(r)

    leftover = total - sum(s.count * q for s, q in zip(segments, base, strict=True))
    extra = [0] * len(segments)
    for i in sorted(range(len(segments)), key=lambda i: (-remainders[i], i)):
        if leftover <= 0 or remainders[i] == 0:
            break
        extra[i] = min(segments[i].count, leftover)
        leftover -= extra[i]
    if leftover:
        raise AssertionError("largest-remainder rounding did not place every sample")

    shares: list[Share] = []
    for i, s in enumerate(segments):
        if extra[i]:
            shares.append(Share(i, s.start, s.start + extra[i], base[i] + 1))
        if extra[i] < s.count:
            shares.append(Share(i, s.start + extra[i], s.stop, base[i]))
    return shares
