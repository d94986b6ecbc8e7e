"""The proportional split: each micro-step's samples shared out by throughput over a mixed
cluster (or under divisibility "balance"), every replica with the same accumulation count."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from app.core.cluster.topology import ReplicaLayout, Segment
from app.core.records.integers import ceil_div, smallest_divisor_at_least
from app.core.records.plan_request import MAX_SAFE_INTEGER, Divisibility
from app.core.split.batch_problem import BatchProblem, BatchSolution, NoFit, moved_warning
from app.core.split.curve_split import best_accumulation, curve_split
from app.core.split.shares import proportional_shares

_SEARCH_STEPS = 512  # bounded scans keep every answer within milliseconds


def capped_layout(p: BatchProblem) -> ReplicaLayout:
    """Balance with a fixed micro_batch_size: that size is every replica's ceiling."""
    m = p.micro_batch_size
    if m is None:
        return p.layout
    segments = tuple(
        Segment(s.start, s.stop, s.node_group, s.throughput, m if s.cap is None else min(m, s.cap), s.curve)
        for s in p.layout.segments
    )
    return replace(p.layout, segments=segments)


def _fits_total(total: int, D: int, capacity: int | None) -> int | None:
    """Smallest accumulation g with g | total and D <= total/g <= capacity."""
    low = ceil_div(total, capacity) if capacity else 1
    return smallest_divisor_at_least(total, low, total // D)


def _scan(start: int, step: int, ok: Callable[[int], bool]) -> int | None:
    value = start
    for _ in range(_SEARCH_STEPS):
        if value < 1 or value > MAX_SAFE_INTEGER:
            return None
        if ok(value):
            return value
        value += step
    return None


def nearest_total(G: int, D: int, capacity: int | None, up: bool) -> int | None:
    """Nearest global batch at or beyond G (in the policy's direction) that some
    accumulation count splits into micro-steps of D..capacity samples."""
    if up:
        if G <= D:
            return D
        if capacity is None or G <= capacity:
            return G
        found = _scan(G, 1, lambda x: _fits_total(x, D, capacity) is not None)
        fallback = capacity * ceil_div(G, capacity)  # g = ceil(G/C), full micro-steps
        return found if found is not None else (fallback if fallback <= MAX_SAFE_INTEGER else None)
    if G < D:
        return None
    if capacity is None or G <= capacity:
        return G
    found = _scan(G, -1, lambda x: _fits_total(x, D, capacity) is not None)
    return found if found is not None else capacity * (G // capacity)


def solve_proportional(p: BatchProblem, with_shares: bool) -> BatchSolution:
    layout = capped_layout(p)
    D, C = layout.data_parallel_size, layout.capacity
    G, g = p.global_batch_size, p.gradient_accumulation_steps
    assert G is not None  # choose_split picks an even split without one
    warnings: tuple[str, ...] = ()
    room = f"between {D} (one sample per replica)" + (f" and {C} (every cap full)" if C else "")
    if g is not None:
        most = g * C if C is not None else None
        fits = G % g == 0 and G // g >= D and (most is None or G <= most)
        if not fits:
            why = f"a multiple of accumulation {g} whose micro-step total lies {room}"
            if p.strict:
                raise NoFit(f"global_batch_size {G} is not {why}", "/global_batch_size")
            if p.divisibility is Divisibility.ROUND_DOWN:
                value = g * min(G // g, C if C is not None else G)
                if value // g < D:
                    raise NoFit(f"no global batch at or below {G} is {why}", "/global_batch_size")
            else:
                value = g * max(ceil_div(G, g), D)
                if (most is not None and value > most) or value > MAX_SAFE_INTEGER:
                    raise NoFit(f"no global batch at or above {G} is {why}", "/global_batch_size")
            warnings = moved_warning(G, value, p.divisibility, why)
            G = value
    else:
        found = _fits_total(G, D, C)
        if found is None:
            why = f"divisible by an accumulation count whose micro-step total lies {room}"
            if p.strict:
                raise NoFit(f"global_batch_size {G} is not {why}", "/global_batch_size")
            moved = nearest_total(G, D, C, up=p.divisibility is Divisibility.ROUND_UP)
            if moved is None:
                raise NoFit(f"no global batch at or below {G} is {why}", "/global_batch_size")
            warnings = moved_warning(G, moved, p.divisibility, why)
            G = moved
            found = _fits_total(G, D, C)
        assert found is not None
        g = found
    if not with_shares:
        return BatchSolution(G, g, (), warnings)
    if layout.segments[0].curve is None:
        return BatchSolution(G, g, tuple(proportional_shares(G // g, layout.segments)), warnings)
    # Measured curves: the accumulation with the shortest predicted step, unless the request
    # fixed it, and the split that minimises the slowest replica's micro-step (curve_split).
    split = curve_split(layout)
    if p.gradient_accumulation_steps is None:
        g = best_accumulation(split, G, g, G // D)
    return BatchSolution(G, g, tuple(split.split(G // g)[0]), warnings)
