"""Invariants of plan() over random homogeneous and mixed clusters (hypothesis): the contract,
balance, and mixed shares (what plan() infers from part of a request:
test_plan_inference_properties.py)."""

from __future__ import annotations

import random
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st
from plan_helpers import (
    as_rational,
    assert_invariants,
    ddp_gradient,
    examples,
    replica_micro_batches,
    requests,
    throughputs,
    try_plan,
)

from app.core.records.plan import Plan
from app.core.records.plan_request import Divisibility, LossReduction, NodeGroup, PlanRequest, Topology


def assert_gradient_is_global_mean(result: Plan, reduction: LossReduction, rng: random.Random) -> None:
    G = result.global_batch_size
    per_sample = [Fraction(rng.randint(-1000, 1000), rng.randint(1, 7)) for _ in range(G)]
    assert ddp_gradient(result, per_sample, reduction) == sum(per_sample, Fraction(0)) / G
    # The floats are the correctly rounded values of those exact scales.
    for group in result.replica_groups:
        assert float(as_rational(group.loss_scale, G)) == group.loss_scale


@examples(120)
@given(request=requests(), seed=st.integers(0, 2**32))
def test_every_solved_plan_honours_the_contract(request: PlanRequest, seed: int) -> None:
    result = try_plan(request)
    if result is None:
        return
    assert_invariants(request, result)
    if result.global_batch_size <= 4000:
        assert_gradient_is_global_mean(result, request.loss_reduction, random.Random(seed))


@examples(120)
@given(request=requests(policies=(Divisibility.BALANCE,)), seed=st.integers(0, 2**32))
def test_balance_keeps_the_global_batch_and_the_gradient(request: PlanRequest, seed: int) -> None:
    result = try_plan(request)
    if result is None:
        return
    assert_invariants(request, result)
    if request.global_batch_size is not None:
        assert result.global_batch_size == request.global_batch_size
    assert_gradient_is_global_mean(result, request.loss_reduction, random.Random(seed))


@examples(80)
@given(
    replicas=st.integers(2, 40),
    global_batch=st.integers(1, 2000),
    accumulation=st.one_of(st.none(), st.integers(1, 6)),
)
def test_balance_on_a_homogeneous_cluster_differs_by_at_most_one(
    replicas: int, global_batch: int, accumulation: int | None
) -> None:
    request = PlanRequest(
        topology=Topology.homogeneous(replicas, 1),
        global_batch_size=global_batch,
        gradient_accumulation_steps=accumulation,
        divisibility=Divisibility.BALANCE,
    )
    result = try_plan(request)
    per_step_ok = [
        g for g in range(1, global_batch + 1) if global_batch % g == 0 and global_batch // g >= replicas
    ]
    if accumulation is not None:
        per_step_ok = [g for g in per_step_ok if g == accumulation]
    assert (result is not None) == bool(per_step_ok), "balance works whenever some accumulation divides"
    if result is None:
        return
    micros = replica_micro_batches(result)
    assert max(micros) - min(micros) <= 1
    assert result.global_batch_size == global_batch
    # Largest remainder ties go to the lower ranks: the larger shares come first.
    assert micros == sorted(micros, reverse=True)
    if accumulation is None:
        assert result.gradient_accumulation_steps == min(per_step_ok)


@examples(80)
@given(
    groups=st.lists(
        st.tuples(st.integers(1, 3), st.sampled_from([1, 2, 4]), throughputs), min_size=2, max_size=3
    ),
    per_step=st.integers(1, 400),
)
def test_uncapped_mixed_shares_are_largest_remainder_quotas(
    groups: list[tuple[int, int, float]], per_step: int
) -> None:
    topology = Topology(
        tuple(NodeGroup(f"g{i}", n, k, w) for i, (n, k, w) in enumerate(groups)), listed_groups=True
    )
    weights = [Fraction(w) for n, k, w in groups for _ in range(n * k)]
    if per_step < len(weights):
        return
    result = try_plan(
        PlanRequest(
            topology=topology,
            global_batch_size=per_step,
            gradient_accumulation_steps=1,
            divisibility=Divisibility.BALANCE,  # proportional even when the throughputs are equal
        )
    )
    assert result is not None
    micros = replica_micro_batches(result)
    quotas = [per_step * w / sum(weights) for w in weights]
    if min(quotas) < 1:
        return  # the floor of one sample moves the water level; covered by the invariants
    for micro, quota in zip(micros, quotas, strict=True):
        assert quota - 1 < micro < quota + 1
    for a in range(len(weights)):
        for b in range(len(weights)):
            if weights[a] > weights[b]:
                assert micros[a] >= micros[b]
