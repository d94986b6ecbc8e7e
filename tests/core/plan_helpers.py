"""Small builders and oracles shared by the core tests (not a test module): requests built by
hand or drawn at random (hypothesis strategies), and the invariants every solved plan holds."""

from __future__ import annotations

import itertools
import os
from dataclasses import replace
from fractions import Fraction
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from app.core.errors.domain import PlanError
from app.core.planner import plan
from app.core.records.plan import Plan
from app.core.records.plan_request import (
    Divisibility,
    LossReduction,
    NodeGroup,
    Parallelism,
    PlanRequest,
    Topology,
)


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


# Random requests over homogeneous and mixed clusters, and what every solved plan holds.
caps = st.one_of(st.none(), st.integers(1, 64))
throughputs = st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 0.3, 1.1])


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    if draw(st.booleans()):
        return Topology.homogeneous(draw(st.integers(1, 6)), draw(st.sampled_from([1, 2, 3, 4, 8])))
    count = draw(st.integers(1, 3))
    groups = tuple(
        NodeGroup(
            f"g{i}",
            draw(st.integers(1, 3)),
            draw(st.sampled_from([1, 2, 4, 8])),
            draw(throughputs),
            draw(caps),
        )
        for i in range(count)
    )
    return Topology(groups, listed_groups=True)


@st.composite
def requests(draw: st.DrawFn, policies: tuple[Divisibility, ...] = tuple(Divisibility)) -> PlanRequest:
    topology = draw(topologies())
    world = topology.world_size
    tensor = draw(st.sampled_from([d for d in (1, 2, 4) if world % d == 0]))
    dp = world // tensor
    # Mostly values near multiples of the replica count, so that many requests are feasible.
    global_batch = draw(st.one_of(st.integers(1, 3000), st.integers(1, 64).map(lambda k: k * dp)))
    micro = draw(st.one_of(st.none(), st.none(), st.integers(1, 64)))
    accumulation = draw(st.one_of(st.none(), st.none(), st.integers(1, 8)))
    give_global = micro is None or draw(st.booleans())
    return PlanRequest(
        topology=topology,
        global_batch_size=global_batch if give_global else None,
        micro_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        max_micro_batch_size=draw(caps),
        divisibility=draw(st.sampled_from(policies)),
        parallelism=Parallelism(tensor=tensor),
        loss_reduction=draw(st.sampled_from(list(LossReduction))),
    )


def rank_caps(request: PlanRequest, dp: int) -> list[int | None]:
    """Each replica's effective cap, worked out GPU by GPU from the request."""
    per_gpu: list[int | None] = []
    for group in request.topology.node_groups:
        per_gpu += [group.max_micro_batch_size] * group.num_gpus
    mp = request.parallelism.model_parallel_size
    out: list[int | None] = []
    for replica in range(dp):
        known = [c for c in [*per_gpu[replica * mp : (replica + 1) * mp], request.max_micro_batch_size] if c]
        out.append(min(known) if known else None)
    return out


def assert_invariants(request: PlanRequest, result: Plan, *, echoes_request: bool = True) -> None:
    world = request.topology.world_size
    mp = request.parallelism.model_parallel_size
    dp = world // mp
    G, g = result.global_batch_size, result.gradient_accumulation_steps
    assert (result.world_size, result.model_parallel_size, result.data_parallel_size) == (world, mp, dp)
    if echoes_request:
        assert result.requested_global_batch_size == request.global_batch_size

    # Groups: contiguous, in order, covering [0, dp).
    edges = [(group.start, group.stop) for group in result.replica_groups]
    assert edges[0][0] == 0 and edges[-1][1] == dp
    assert all(a_stop == b_start for (_, a_stop), (b_start, _) in itertools.pairwise(edges))
    assert all(start < stop for start, stop in edges)
    assert len(result.replica_groups) <= 4 * len(request.topology.node_groups)

    # Samples add up; accumulation is shared; caps and floors hold.
    assert sum((grp.stop - grp.start) * grp.samples_per_step for grp in result.replica_groups) == G
    assert all(grp.samples_per_step == grp.micro_batch_size * g for grp in result.replica_groups)
    micros = replica_micro_batches(result)
    for micro, cap in zip(micros, rank_caps(request, dp), strict=True):
        assert micro >= 1
        assert cap is None or micro <= cap
    if request.micro_batch_size is not None:
        assert max(micros) <= request.micro_batch_size
    assert result.micro_batch_size == (micros[0] if len(set(micros)) == 1 else None)
    assert result.split == ("even" if len(set(micros)) == 1 else "proportional")

    # The fields the request fixed are kept; strict policies keep the global batch.
    if request.gradient_accumulation_steps is not None:
        assert g == request.gradient_accumulation_steps
    if request.global_batch_size is not None and request.divisibility in (
        Divisibility.EXACT,
        Divisibility.BALANCE,
    ):
        assert G == request.global_batch_size
    if request.global_batch_size is None:
        assert G == request.micro_batch_size * (request.gradient_accumulation_steps or 1) * dp
