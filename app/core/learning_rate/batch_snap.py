"""The global batch a scaling law's recommendation snaps to: the nearest whole-sequence batch that
this cluster and parallelism split exactly, on both sides of the law's, each candidate planned
by the planner (handed in as `plans`, which sits floors above). Candidates step by what an even
split can hold (data-parallel size x a fixed micro-batch x a fixed accumulation), or sequence by
sequence where replicas take different shares."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

from app.core.errors.domain import PlanError
from app.core.records.integers import ceil_div
from app.core.records.plan import Plan
from app.core.records.plan_request import MAX_SAFE_INTEGER, Divisibility, PlanRequest
from app.core.records.record import record

Plans = Callable[[PlanRequest], Plan]
TRIES_PER_SIDE = 32  # candidate batches planned on each side of the law's before giving up


@record
class Snap:
    """The nearest whole-sequence global batch this cluster splits exactly, and its plan."""

    global_batch_size: int
    plan: Plan  # the batch alone planned (no learning rate, no resume)


def gives_batch(request: PlanRequest) -> bool:
    """Whether the request fixes the global batch itself (global, or micro with accumulation)."""
    if request.global_batch_size is not None or request.global_batch_tokens is not None:
        return True
    micro = request.micro_batch_size is not None or request.micro_batch_tokens is not None
    return micro and request.gradient_accumulation_steps is not None


def batch_request(request: PlanRequest, *, keep_batch: bool) -> PlanRequest:
    """The request's batch alone, as the snap plans it: no learning rate, resume or law. Without
    `keep_batch` the global batch is left for a candidate to fill, and an accumulation the request
    fixed together with its micro-batch is freed (they fixed the request's own batch)."""
    fixed_by_micro = request.gradient_accumulation_steps is not None and (
        request.micro_batch_size is not None or request.micro_batch_tokens is not None
    )
    changes: dict[str, object] = {"recommend": None, "learning_rate": None, "resume": None}
    if not keep_batch:
        changes |= {"global_batch_size": None, "global_batch_tokens": None}
        if request.divisibility is not Divisibility.BALANCE:
            changes["divisibility"] = Divisibility.EXACT  # a candidate splits as it is, or not at all
        if fixed_by_micro:
            changes["gradient_accumulation_steps"] = None
    return dataclasses.replace(request, **changes)  # type: ignore[arg-type]


def _quantum(request: PlanRequest, data_parallel_size: int, uneven: bool) -> int:
    """The step between global batches an even split can hold: data-parallel size x the micro-batch
    and accumulation the request fixes. 1 where replicas take different shares."""
    if uneven or request.divisibility is Divisibility.BALANCE:
        return 1
    seq = request.sequence_length or 1
    micro = request.micro_batch_size
    if micro is None and request.micro_batch_tokens is not None and request.micro_batch_tokens % seq == 0:
        micro = request.micro_batch_tokens // seq
    fixed_by_micro = request.gradient_accumulation_steps is not None and micro is not None
    accumulation = request.gradient_accumulation_steps if not fixed_by_micro else None
    return data_parallel_size * (micro or 1) * (accumulation or 1)


def snap(
    request: PlanRequest, target: float, data_parallel_size: int, uneven: bool, plans: Plans
) -> Snap | None:
    """The nearest global batch in whole sequences to `target` that plans exactly, of the first
    that plans on each side (ties: the smaller)."""
    seq = request.sequence_length
    assert seq is not None
    base = batch_request(request, keep_batch=False)
    q = _quantum(request, data_parallel_size, uneven)
    lowest = max(data_parallel_size, 1)  # every replica takes a sample each micro-step

    def planned(size: int) -> Snap | None:
        try:
            plan = plans(dataclasses.replace(base, global_batch_tokens=size * seq))
        except PlanError:
            return None
        return Snap(size, plan) if plan.global_batch_size == size else None

    k = math.floor(target / q)
    below = _first((i * q for i in range(k, k - TRIES_PER_SIDE, -1) if i * q >= lowest), planned)
    start = max(k + 1, ceil_div(lowest, q))
    limit = MAX_SAFE_INTEGER // seq
    above = _first((i * q for i in range(start, start + TRIES_PER_SIDE) if i * q <= limit), planned)
    found = [s for s in (below, above) if s is not None]
    return min(found, key=lambda s: (abs(s.global_batch_size - target), s.global_batch_size), default=None)


def _first(sizes: Iterable[int], planned: Callable[[int], Snap | None]) -> Snap | None:
    for size in sizes:
        found = planned(size)
        if found is not None:
            return found
    return None
