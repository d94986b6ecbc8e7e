"""Plans from measured throughput curves (issue 38), against exhaustive search: for random
curves, caps and global batches, the split keeps the global batch exact and no other split of
the same accumulation, nor any split of another accumulation that keeps the global batch, has a
shorter predicted step.

The oracle restates the documented prediction (docs/throughput-curves.md) in exact rationals,
independently of app.core.records.throughput_curve: the measured time b / samples_per_s at each point,
never shorter than a smaller point's, a straight line in time between points, the smallest
point's time below it and the largest point's samples/s above it. The search is exhaustive: a
dynamic programme over the replicas that tries every micro-batch of every replica."""

from __future__ import annotations

from fractions import Fraction
from functools import cache

import pytest
from hypothesis import given
from hypothesis import strategies as st
from plan_helpers import ddp_gradient, examples, replica_micro_batches, try_plan

from app.core.records.plan import Plan
from app.core.records.plan_request import Divisibility, NodeGroup, Parallelism, PlanRequest, Topology
from app.core.records.throughput_curve import ThroughputCurve

Point = tuple[int, float]


def exact_time(points: list[Point], b: int) -> Fraction:
    times: list[Fraction] = []
    for size, rate in points:
        t = Fraction(size) / Fraction(rate)
        times.append(max(t, times[-1]) if times else t)
    sizes = [size for size, _ in points]
    if b <= sizes[0]:
        return times[0]
    if b >= sizes[-1]:
        return times[-1] * b / sizes[-1]
    i = max(j for j, size in enumerate(sizes) if size <= b)
    return times[i] + (times[i + 1] - times[i]) * (b - sizes[i]) / (sizes[i + 1] - sizes[i])


def best_slowest(replicas: list[tuple[list[Point], int]], total: int, even: bool = False) -> Fraction | None:
    """The least possible slowest micro-step over every split of `total` samples, each replica
    1..cap (`even`: every replica the same); None when no split exists."""
    if even:
        points, cap = replicas[0]
        share, rest = divmod(total, len(replicas))
        return exact_time(points, share) if not rest and 1 <= share <= cap else None

    @cache
    def best(r: int, left: int) -> Fraction | None:
        if r == len(replicas):
            return Fraction(0) if left == 0 else None
        points, cap = replicas[r]
        found: Fraction | None = None
        for b in range(1, min(cap, left) + 1):
            rest = best(r + 1, left - b)
            if rest is not None:
                value = max(exact_time(points, b), rest)
                found = value if found is None or value < found else found
        return found

    return best(0, total)


@st.composite
def curves(draw: st.DrawFn) -> list[Point]:
    sizes = sorted(draw(st.sets(st.integers(1, 24), min_size=1, max_size=4)))
    # Rates that rise, saturate and fall again, and noisy ones (a larger micro-batch faster).
    return [(b, draw(st.floats(1.0, 1000.0))) for b in sizes]


@st.composite
def curve_requests(draw: st.DrawFn) -> tuple[PlanRequest, list[tuple[list[Point], int]]]:
    """A mixed or homogeneous cluster with curves, under exact or balance."""
    groups, replicas = [], []
    for i in range(draw(st.integers(1, 3))):
        points = draw(curves())
        cap = draw(st.one_of(st.none(), st.integers(points[-1][0], points[-1][0] + 8)))
        gpus = draw(st.integers(1, 3))
        curve = ThroughputCurve(tuple(b for b, _ in points), tuple(r for _, r in points))
        groups.append(NodeGroup(f"g{i}", 1, gpus, max_micro_batch_size=cap, throughput_curve=curve))
        replicas += [(points, cap if cap is not None else 10**6)] * gpus
    topology = Topology(tuple(groups), listed_groups=True)
    global_batch = draw(st.integers(len(replicas), 48))
    policy = draw(st.sampled_from([Divisibility.EXACT, Divisibility.BALANCE]))
    return PlanRequest(topology=topology, global_batch_size=global_batch, divisibility=policy), replicas


def _slowest(result: Plan, replicas: list[tuple[list[Point], int]]) -> Fraction:
    return max(
        exact_time(points, b) for (points, _), b in zip(replicas, replica_micro_batches(result), strict=True)
    )


def _close(a: Fraction, b: Fraction) -> bool:
    """a <= b, up to the floats the planner computes in."""
    return a <= b * (1 + Fraction(1, 10**9))


@examples(150)
@given(drawn=curve_requests())
def test_the_curve_split_is_exact_and_no_split_is_faster(
    drawn: tuple[PlanRequest, list[tuple[list[Point], int]]],
) -> None:
    request, replicas = drawn
    G = request.global_batch_size
    assert G is not None
    result = try_plan(request)
    # Under exact, replicas that are all alike (one curve, one cap) take an even split.
    even = request.divisibility is Divisibility.EXACT and len({(tuple(p), c) for p, c in replicas}) == 1
    feasible = [g for g in range(1, G + 1) if G % g == 0 and best_slowest(replicas, G // g, even) is not None]
    if result is None:
        assert not feasible, f"refused, though accumulation {feasible} has splits"
        return
    g = result.gradient_accumulation_steps
    micro = replica_micro_batches(result)
    # The global batch, exactly, within every cap and at least 1 sample each.
    assert result.global_batch_size == G
    assert sum(micro) * g == G
    assert all(1 <= b <= cap for b, (_, cap) in zip(micro, replicas, strict=True))
    # No split of the same accumulation has a shorter slowest micro-step.
    slowest = _slowest(result, replicas)
    same = best_slowest(replicas, G // g, even)
    assert same is not None and _close(slowest, same), (slowest, same)
    # Nor does any other accumulation that keeps the global batch have a shorter step.
    for other in feasible:
        step = best_slowest(replicas, G // other, even)
        assert step is not None and _close(g * slowest, other * step), (g, other)
    # Loss scales as for any uneven split: DDP's average is the gradient of the mean loss.
    per_sample = [Fraction(k * 7919 % 101 - 50, 1 + k % 5) for k in range(G)]
    assert ddp_gradient(result, per_sample, request.loss_reduction) == sum(per_sample, Fraction(0)) / G
    # What the plan states is what the curves predict for its split.
    assert result.throughput is not None
    assert abs(Fraction(result.throughput.predicted_micro_step_s) - slowest) <= slowest * Fraction(1, 10**12)
    for group in result.replica_groups:
        points = replicas[group.start][0]
        assert group.predicted_micro_step_s is not None
        expected = exact_time(points, group.micro_batch_size)
        assert abs(Fraction(group.predicted_micro_step_s) - expected) <= expected * Fraction(1, 10**12)


def test_a_model_parallel_block_across_two_groups_runs_at_the_slower_curve() -> None:
    """Tensor parallel 2 over groups of 3 GPUs: one replica straddles both groups and is
    predicted, at every micro-batch either group measured, at the slower group's time."""
    fast = [(4, 400.0), (8, 700.0), (16, 900.0)]
    slow = [(4, 300.0), (8, 450.0), (12, 500.0)]

    def group(name: str, points: list[Point]) -> NodeGroup:
        curve = ThroughputCurve(tuple(b for b, _ in points), tuple(r for _, r in points))
        return NodeGroup(name, 1, 3, throughput_curve=curve)

    request = PlanRequest(
        topology=Topology((group("fast", fast), group("slow", slow)), listed_groups=True),
        global_batch_size=36,
        parallelism=Parallelism(tensor=2),
    )
    result = try_plan(request)
    assert result is not None and result.throughput is not None
    by_group = {g.node_group: g for g in result.replica_groups}
    straddling = by_group["fast+slow"]
    b = straddling.micro_batch_size
    expected = max(exact_time(fast, b), exact_time(slow, b))
    if b in {p for p, _ in fast} | {p for p, _ in slow}:  # at a measured point: exactly the slower
        assert Fraction(straddling.predicted_micro_step_s or 0) == pytest.approx(expected, rel=1e-12)
    else:  # between points: no faster than either group
        assert Fraction(straddling.predicted_micro_step_s or 0) >= expected * (1 - Fraction(1, 10**12))
    assert (
        sum(g.count * g.micro_batch_size for g in result.replica_groups) * result.gradient_accumulation_steps
        == 36
    )
