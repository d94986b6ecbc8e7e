"""Solve global = micro x accumulation x data-parallel size, DeepSpeed's way.

Two kinds of split:
- even: every replica takes the same micro-batch (a homogeneous cluster, or any cluster
  when the request fixes micro_batch_size);
- proportional: each micro-step's samples are shared out by throughput (a mixed cluster,
  or divisibility "balance"), every replica with the same accumulation count.

Infeasible requests raise InfeasiblePlan with suggestions; each suggested value is
checked by solving the request again with that one value substituted. The problem and its
solution are in batch_problem, the proportional split in batch_proportional.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from app.core.cluster.topology import ReplicaLayout, uniform_layout
from app.core.errors.domain import InfeasiblePlan, InvalidValue
from app.core.records.integers import ceil_div, divisors, nearest, smallest_divisor_at_least
from app.core.records.plan_request import MAX_SAFE_INTEGER, Divisibility
from app.core.split.batch_problem import BatchProblem, BatchSolution, NoFit, moved_warning
from app.core.split.curve_split import fastest_even_accumulation
from app.core.split.proportional import capped_layout, nearest_total, solve_proportional
from app.core.split.shares import Share


def choose_split(
    layout: ReplicaLayout,
    global_batch_size: int | None,
    micro_batch_size: int | None,
    divisibility: Divisibility,
) -> bool:
    """True for a proportional split. It shares out a given global batch, so without
    one (micro alone, or micro and accumulation) the split is even."""
    if global_batch_size is None:
        return False
    if divisibility is Divisibility.BALANCE:
        return True
    return layout.heterogeneous and micro_batch_size is None


def solve(problem: BatchProblem) -> BatchSolution:
    try:
        return _solve(problem)
    except NoFit as err:
        raise InfeasiblePlan(err.detail, pointer=err.pointer, suggestions=suggest(problem)) from None


def feasible_as_given(problem: BatchProblem) -> bool:
    try:
        _solve(replace(problem, divisibility=_strict_policy(problem)), shares=False)
    except (NoFit, InvalidValue):
        return False
    return True


def _strict_policy(problem: BatchProblem) -> Divisibility:
    return Divisibility.BALANCE if problem.divisibility is Divisibility.BALANCE else Divisibility.EXACT


def _solve(p: BatchProblem, shares: bool = True) -> BatchSolution:
    """`shares=False` answers feasibility alone, without sharing samples out: suggestions
    test many candidates, and on a large mixed cluster the sharing is the costly part."""
    if p.global_batch_size is None and p.micro_batch_size is None:
        raise InvalidValue(
            "give global_batch_size or micro_batch_size (or both)", pointer="/global_batch_size"
        )
    return solve_proportional(p, shares) if p.proportional else _solve_even(p)


# ---------------------------------------------------------------- even split


def _round_to_unit(p: BatchProblem, unit: int, most: int | None, why: str) -> tuple[int, tuple[str, ...]]:
    """The global batch, or the nearest multiple of `unit` in [unit, most] under the policy."""
    G = p.global_batch_size
    assert G is not None
    fits = G % unit == 0 and (most is None or G <= most)
    if fits:
        return G, ()
    if p.strict:
        if G % unit == 0 and most is not None:
            raise NoFit(
                f"global_batch_size {G} needs micro-batches of {G // unit}, above the "
                f"cap of {p.layout.uniform_cap} (max_micro_batch_size): with "
                f"accumulation {p.gradient_accumulation_steps} it can be at most {most}",
                "/global_batch_size",
            )
        raise NoFit(f"global_batch_size {G} is not {why}", "/global_batch_size")
    if p.divisibility is Divisibility.ROUND_DOWN:
        value = min(G // unit * unit, most if most is not None else G)
        if value < unit:
            raise NoFit(
                f"no global batch at or below {G} is {why}; the smallest is {unit}", "/global_batch_size"
            )
    else:
        value = ceil_div(G, unit) * unit
        if (most is not None and value > most) or value > MAX_SAFE_INTEGER:
            raise NoFit(f"no global batch at or above {G} is {why}", "/global_batch_size")
    return value, moved_warning(G, value, p.divisibility, why)


def _even_shares(layout: ReplicaLayout, micro: int) -> tuple[Share, ...]:
    return tuple(Share(i, s.start, s.stop, micro) for i, s in enumerate(layout.segments))


def _solve_even(p: BatchProblem) -> BatchSolution:
    D = p.layout.data_parallel_size
    cap = p.layout.uniform_cap
    G, m, g = p.global_batch_size, p.micro_batch_size, p.gradient_accumulation_steps
    if m is not None and cap is not None and m > cap:
        raise NoFit(
            f"micro_batch_size {m} is above the cap of {cap} samples per replica (max_micro_batch_size)",
            "/micro_batch_size",
        )
    warnings: tuple[str, ...] = ()
    if G is None:
        assert m is not None
        g = g or 1
        G = m * g * D
        if G > MAX_SAFE_INTEGER:
            raise NoFit(
                f"micro {m} x accumulation {g} x {D} replicas = {G} is above the limit of {MAX_SAFE_INTEGER}",
                "/micro_batch_size",
            )
    elif m is not None and g is not None:
        if G != m * g * D:
            raise NoFit(
                f"global_batch_size {G} != micro_batch_size {m} x gradient_accumulation_steps "
                f"{g} x data_parallel_size {D} = {m * g * D}",
                "/global_batch_size",
            )
    elif m is not None:
        G, warnings = _round_to_unit(p, m * D, None, f"a multiple of micro {m} x {D} replicas = {m * D}")
        g = G // (m * D)
    elif g is not None:
        most = cap * g * D if cap is not None else None
        why = f"a multiple of accumulation {g} x {D} replicas = {g * D}"
        if most is not None:
            why += f", at most {most} (cap {cap} x accumulation {g} x {D} replicas)"
        G, warnings = _round_to_unit(p, g * D, most, why)
        m = G // (g * D)
    else:
        G, warnings = _round_to_unit(p, D, None, f"a multiple of the {D} data-parallel replicas")
        per_replica = G // D
        g = smallest_divisor_at_least(per_replica, ceil_div(per_replica, cap) if cap else 1)
        assert g is not None  # per_replica itself always qualifies
        if p.layout.segments[0].curve is not None:  # one curve for all: its fastest micro-batch
            g = fastest_even_accumulation(p.layout, per_replica, g)
        m = per_replica // g
    return BatchSolution(G, g, _even_shares(p.layout, m), warnings)


# ------------------------------------------------------------------ suggestions


def _checked(p: BatchProblem, field: str, values: Iterable[int], target: int) -> list[int]:
    def works(v: int) -> bool:
        changes: dict[str, Any] = {field: v}
        return feasible_as_given(replace(p, **changes))

    ok = [v for v in set(values) if 1 <= v <= MAX_SAFE_INTEGER and works(v)]
    return nearest(ok, target)


def _divisors_near(n: int, target: int, keep: Callable[[int], bool]) -> list[int]:
    if n < 1 or n > MAX_SAFE_INTEGER:
        return []
    return nearest([d for d in divisors(n) if keep(d)], target)


def _global_candidates(p: BatchProblem, G: int) -> list[int]:
    """Global batches near G that the request's other fields can split."""
    m, g = p.micro_batch_size, p.gradient_accumulation_steps
    D = p.layout.data_parallel_size
    globals_: list[int] = []
    if p.proportional:
        C = capped_layout(p).capacity
        if g is not None:
            k = G // g
            return [g * j for j in (k - 1, k, k + 1, k + 2, D, C or D) if j >= 1]
        for up in (False, True):
            v = nearest_total(G, D, C, up)
            if v is not None:
                globals_.append(v)
                nxt = nearest_total(v - 1 if not up else v + 1, D, C, up)
                if nxt is not None:
                    globals_.append(nxt)
        return globals_
    if m is not None and g is not None:
        return [m * g * D]
    unit = D * (m or 1) * (g or 1)
    k = G // unit
    globals_ = [unit * j for j in (k - 1, k, k + 1, k + 2) if j >= 1]
    cap = p.layout.uniform_cap
    if g is not None and cap is not None:
        globals_.append(cap * g * D)
    return globals_


def suggest(p: BatchProblem) -> dict[str, list[int]]:
    """Nearest values that make the request feasible, one field changed at a time."""
    G, m, g = p.global_batch_size, p.micro_batch_size, p.gradient_accumulation_steps
    D = p.layout.data_parallel_size
    out: dict[str, list[int]] = {}

    if G is not None:
        globals_ = _global_candidates(p, G)
        out["global_batch_size"] = _checked(p, "global_batch_size", globals_, G)

    if G is not None and not p.proportional:
        cap = p.layout.uniform_cap
        if g is not None:
            micros = [G // (g * D)] if G % (g * D) == 0 else []
        else:
            micros = _divisors_near(
                G // D if G % D == 0 else 0, m or cap or G // D or 1, lambda d: cap is None or d <= cap
            )
        out["micro_batch_size"] = _checked(p, "micro_batch_size", micros, m or cap or 1)
        if m is not None:
            accums = [G // (m * D)] if G % (m * D) == 0 else []
        else:
            per = G // D if G % D == 0 else 0
            accums = _divisors_near(per, g or 1, lambda d: cap is None or per // d <= cap)
        out["gradient_accumulation_steps"] = _checked(p, "gradient_accumulation_steps", accums, g or 1)
        fixed = (m or 1) * (g or 1)
        quotient = G // fixed if G % fixed == 0 else 0
        out["data_parallel_size"] = _divisors_near(
            quotient,
            D,
            lambda d: (
                d != D
                and feasible_as_given(
                    replace(p, layout=uniform_layout(d, p.layout.model_parallel_size, p.layout.uniform_cap))
                )
            ),
        )
    elif G is not None:
        C = capped_layout(p).capacity
        accums = _divisors_near(G, g or 1, lambda d: G // d >= D and (C is None or G // d <= C))
        out["gradient_accumulation_steps"] = _checked(p, "gradient_accumulation_steps", accums, g or 1)
    elif m is not None:
        cap = p.layout.uniform_cap
        if cap is not None and m > cap:
            out["micro_batch_size"] = [cap]

    return {k: v for k, v in out.items() if v}
