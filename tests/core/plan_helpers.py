"""Small builders and oracles shared by the core tests (not a test module)."""

from __future__ import annotations

import os
from dataclasses import replace
from fractions import Fraction
from typing import Any

from hypothesis import HealthCheck, settings

from app.core.errors import PlanError
from app.core.plan_types import (
    Divisibility,
    LossReduction,
    NodeGroup,
    Parallelism,
    Plan,
    PlanRequest,
    Topology,
)
from app.core.planner import plan


def homogeneous(num_nodes: int, gpus_per_node: int = 1, **fields: Any) -> PlanRequest:
    return PlanRequest(topology=Topology.homogeneous(num_nodes, gpus_per_node), **fields)


def mixed(*groups: tuple[int, int, float, int | None], **fields: Any) -> PlanRequest:
    """Node groups as (num_nodes, gpus_per_node, relative_throughput, max_micro_batch_size)."""
    node_groups = tuple(
        NodeGroup(f"g{i}", nodes, gpus, throughput, cap)
        for i, (nodes, gpus, throughput, cap) in enumerate(groups)
    )
    return PlanRequest(topology=Topology(node_groups, listed_groups=True), **fields)


def try_plan(request: PlanRequest) -> Plan | None:
    """The plan, or None when the planner rejects the request with a PlanError."""
    try:
        return plan(request)
    except PlanError:
        return None


def with_field(request: PlanRequest, **changes: Any) -> PlanRequest:
    return replace(request, **changes)


def replica_micro_batches(result: Plan) -> list[int]:
    """Each data-parallel replica's micro-batch, rank by rank."""
    out: list[int] = []
    for group in result.replica_groups:
        out += [group.micro_batch_size] * (group.stop - group.start)
    return out


def replica_scales(result: Plan) -> list[float]:
    out: list[float] = []
    for group in result.replica_groups:
        out += [group.loss_scale] * (group.stop - group.start)
    return out


def as_rational(value: float, max_denominator: int) -> Fraction:
    """The rational with denominator <= max_denominator that `value` is the float of.

    Loss scales are ratios of integers no larger than the global batch; a correctly rounded
    float of one of them determines it uniquely while max_denominator**2 is far below 2**52.
    """
    return Fraction(value).limit_denominator(max_denominator)


def ddp_gradient(result: Plan, per_sample: list[Fraction], reduction: LossReduction) -> Fraction:
    """What DDP with accumulation computes for a model whose per-sample loss gradient is given.

    Samples of each micro-step are handed out rank by rank; every replica sums
    loss_scale x (mean or sum of its micro-batch) over its accumulation steps, and DDP
    averages the replicas' gradients.
    """
    micros = replica_micro_batches(result)
    scales = [as_rational(s, result.global_batch_size) for s in replica_scales(result)]
    dp = len(micros)
    accumulated = [Fraction(0)] * dp
    position = 0
    for _ in range(result.gradient_accumulation_steps):
        for rank, (micro, scale) in enumerate(zip(micros, scales, strict=True)):
            batch = per_sample[position : position + micro]
            position += micro
            loss_gradient = sum(batch, Fraction(0))
            if reduction is LossReduction.MEAN:
                loss_gradient /= micro
            accumulated[rank] += scale * loss_gradient
    assert position == len(per_sample), "the plan's micro-batches do not add up to the global batch"
    return sum(accumulated, Fraction(0)) / dp


def is_feasible(request: PlanRequest) -> bool:
    return try_plan(replace(request, divisibility=_strict(request.divisibility))) is not None


def _strict(policy: Divisibility) -> Divisibility:
    return Divisibility.BALANCE if policy is Divisibility.BALANCE else Divisibility.EXACT


NO_PARALLELISM = Parallelism()


def examples(count: int) -> Any:
    """Hypothesis settings with `count` examples; BATCHPLAN_HYPOTHESIS_SCALE=20 for a long hunt."""
    scale = int(os.environ.get("BATCHPLAN_HYPOTHESIS_SCALE", "1"))
    return settings(max_examples=count * scale, deadline=None, suppress_health_check=[HealthCheck.too_slow])
