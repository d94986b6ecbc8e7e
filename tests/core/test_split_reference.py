"""The proportional split against an independent, deliberately naive reference: exact
rational water-filling replica by replica, then largest remainder with ties to the lower
rank. The production code works on segments with integer weights; both must agree."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.cluster.topology import Segment
from app.core.split.shares import proportional_shares

Replica = tuple[float, int | None]  # throughput, cap


def _clamp(x: Fraction, cap: int | None) -> Fraction:
    x = max(x, Fraction(1))
    return min(x, Fraction(cap)) if cap is not None else x


def reference(total: int, replicas: list[Replica]) -> list[int]:
    weights = [Fraction(w) for w, _ in replicas]

    def filled(mu: Fraction) -> Fraction:
        return sum((_clamp(mu * w, c) for w, (_, c) in zip(weights, replicas, strict=True)), Fraction(0))

    breaks = sorted(
        {1 / w for w in weights} | {Fraction(c) / w for w, (_, c) in zip(weights, replicas, strict=True) if c}
    )
    breaks.append(breaks[-1] + Fraction(total) / min(weights) + 1)
    low = Fraction(0)
    for high in breaks:
        if filled(high) >= total:
            f_low, f_high = filled(low), filled(high)
            mu = high if f_high == f_low else low + (high - low) * (total - f_low) / (f_high - f_low)
            break
        low = high
    quotas = [_clamp(mu * w, c) for w, (_, c) in zip(weights, replicas, strict=True)]
    assert sum(quotas) == total
    counts = [int(q) for q in quotas]
    order = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


segment_specs = st.lists(
    st.tuples(
        st.integers(1, 6),
        st.sampled_from([0.1, 0.3, 0.5, 1.0, 1.5, 2.0, 3.0, 1 / 3]),
        st.sampled_from([None, 1, 2, 4, 8, 16]),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(specs=segment_specs, data=st.data())
def test_split_matches_the_naive_reference(
    specs: list[tuple[int, float, int | None]], data: st.DataObject
) -> None:
    segments, replicas, start = [], [], 0
    for i, (count, throughput, cap) in enumerate(specs):
        segments.append(Segment(start, start + count, f"g{i}", throughput, cap))
        replicas += [(throughput, cap)] * count
        start += count
    capacity = None if any(c is None for _, _, c in specs) else sum(n * (c or 0) for n, _, c in specs)
    total = data.draw(st.integers(start, capacity if capacity is not None else start * 30))

    got = [0] * start
    for share in proportional_shares(total, tuple(segments)):
        got[share.start : share.stop] = [share.samples] * (share.stop - share.start)

    assert got == reference(total, replicas)
    assert sum(got) == total
    assert all(n >= 1 and (c is None or n <= c) for n, (_, c) in zip(got, replicas, strict=True))
