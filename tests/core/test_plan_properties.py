"""Invariants of plan() over random homogeneous and mixed clusters (hypothesis)."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st
from plan_helpers import (
    as_rational,
    ddp_gradient,
    examples,
    is_feasible,
    replica_micro_batches,
    try_plan,
)

from app.core.plan_types import (
    DatasetSpec,
    Divisibility,
    LossReduction,
    NodeGroup,
    Parallelism,
    Plan,
    PlanRequest,
    Topology,
)

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


# ----------------------------------------------------------------- inference round trips


@examples(120)
@given(
    replicas=st.integers(1, 64),
    micro=st.integers(1, 64),
    accumulation=st.integers(1, 16),
    cap=st.one_of(st.none(), st.integers(1, 128)),
)
def test_any_two_of_the_triad_give_back_the_third(
    replicas: int, micro: int, accumulation: int, cap: int | None
) -> None:
    base = PlanRequest(topology=Topology.homogeneous(replicas, 1), max_micro_batch_size=cap)
    solved = try_plan(replace(base, micro_batch_size=micro, gradient_accumulation_steps=accumulation))
    if cap is not None and micro > cap:
        assert solved is None
        return
    assert solved is not None
    G = solved.global_batch_size
    assert G == micro * accumulation * replicas
    from_global_micro = try_plan(replace(base, global_batch_size=G, micro_batch_size=micro))
    from_global_accum = try_plan(replace(base, global_batch_size=G, gradient_accumulation_steps=accumulation))
    assert from_global_micro is not None and from_global_micro.gradient_accumulation_steps == accumulation
    assert from_global_accum is not None and from_global_accum.micro_batch_size == micro


@examples(120)
@given(
    replicas=st.integers(1, 32), per_replica=st.integers(1, 600), cap=st.one_of(st.none(), st.integers(1, 64))
)
def test_global_alone_takes_the_smallest_accumulation_that_fits(
    replicas: int, per_replica: int, cap: int | None
) -> None:
    request = PlanRequest(
        topology=Topology.homogeneous(replicas, 1),
        global_batch_size=per_replica * replicas,
        max_micro_batch_size=cap,
    )
    result = try_plan(request)
    assert result is not None  # accumulation = per_replica (micro 1) always fits
    fitting = [
        g
        for g in range(1, per_replica + 1)
        if per_replica % g == 0 and (cap is None or per_replica // g <= cap)
    ]
    assert result.gradient_accumulation_steps == fitting[0]
    assert result.micro_batch_size == per_replica // fitting[0]
    if cap is None:
        assert result.gradient_accumulation_steps == 1


@examples(60)
@given(request=requests(policies=(Divisibility.EXACT,)))
def test_a_solved_plan_resubmitted_with_global_and_accumulation_is_the_same_split(
    request: PlanRequest,
) -> None:
    result = try_plan(request)
    if result is None:
        return
    again = try_plan(
        replace(
            request,
            global_batch_size=result.global_batch_size,
            gradient_accumulation_steps=result.gradient_accumulation_steps,
            micro_batch_size=request.micro_batch_size,
        )
    )
    assert again is not None
    assert replica_micro_batches(again) == replica_micro_batches(result)


# --------------------------------------------------------------------------- rounding


def feasible_globals_between(request: PlanRequest, low: int, high: int) -> list[int]:
    return [G for G in range(low, high + 1) if is_feasible(replace(request, global_batch_size=G))]


@examples(100)
@given(
    request=requests(policies=(Divisibility.ROUND_DOWN, Divisibility.ROUND_UP)).filter(
        lambda r: r.global_batch_size is not None
    )
)
def test_rounding_moves_to_the_nearest_feasible_batch_on_the_right_side(request: PlanRequest) -> None:
    asked = request.global_batch_size
    assert asked is not None
    result = try_plan(request)
    down = request.divisibility is Divisibility.ROUND_DOWN
    all_three = request.micro_batch_size is not None and request.gradient_accumulation_steps is not None
    if result is None and all_three:
        return  # an inconsistent triad is a 422 whatever the policy (CONTRACT.md)
    if result is None:
        # Nothing feasible on that side: check below (all of it) or a stretch above.
        low, high = (1, asked) if down else (asked, asked + 300)
        assert feasible_globals_between(request, low, high) == []
        return
    got = result.global_batch_size
    assert result.requested_global_batch_size == asked
    assert got <= asked if down else got >= asked
    assert is_feasible(replace(request, global_batch_size=got)), "the moved batch must itself be feasible"
    if got != asked:
        assert any("moved" in w for w in result.warnings)
    if abs(got - asked) <= 300:
        between = feasible_globals_between(request, min(got, asked), max(got, asked))
        assert between == [got], f"{between} are feasible between {asked} and {got}"
    moved = replace(request, divisibility=Divisibility.EXACT, global_batch_size=got)
    assert_invariants(moved, result, echoes_request=False)


# ------------------------------------------------------------------- epoch arithmetic


@examples(100)
@given(
    request=requests(policies=(Divisibility.EXACT, Divisibility.BALANCE)),
    num_samples=st.integers(1, 10**6),
    drop_last=st.booleans(),
)
def test_every_replica_runs_the_same_micro_steps_and_the_epoch_adds_up(
    request: PlanRequest, num_samples: int, drop_last: bool
) -> None:
    result = try_plan(replace(request, dataset=DatasetSpec(num_samples=num_samples, drop_last=drop_last)))
    if result is None:
        return
    sampler = result.sampler
    assert sampler is not None
    assert sampler.num_replicas == result.data_parallel_size
    steps = sampler.micro_steps_per_epoch
    per_step = result.global_batch_size // result.gradient_accumulation_steps
    assert sampler.optimizer_steps_per_epoch == steps // result.gradient_accumulation_steps
    shards = [
        (group.stop - group.start) * group.num_samples_per_replica
        for group in result.replica_groups
        if group.num_samples_per_replica is not None
    ]
    assert len(shards) == len(result.replica_groups)
    assert sum(shards) == sampler.total_size
    if sampler.kind == "proportional":
        assert sampler.num_samples_per_replica is None
        assert sampler.total_size == steps * per_step
        for group in result.replica_groups:
            assert group.num_samples_per_replica == steps * group.micro_batch_size
        # The proportional sampler covers the epoch like DistributedSampler does: pad up, or drop the tail.
        if drop_last:
            assert sampler.total_size <= num_samples < sampler.total_size + per_step
        else:
            assert sampler.total_size - per_step < num_samples <= sampler.total_size
    else:
        assert sampler.kind == "DistributedSampler"
    assert sampler.padded_samples == (0 if drop_last else sampler.total_size - num_samples)
    assert sampler.dropped_samples == (num_samples - sampler.total_size if drop_last else 0)
    assert sampler.padded_samples >= 0 and sampler.dropped_samples >= 0
