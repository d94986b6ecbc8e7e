"""Invariants of what plan() works out from part of a request (hypothesis): any two of the batch
triad give back the third, rounding moves to the nearest feasible batch, and an epoch's
micro-steps add up."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st
from plan_helpers import assert_invariants, examples, is_feasible, replica_micro_batches, requests, try_plan

from app.core.records.plan_request import DatasetSpec, Divisibility, PlanRequest, Topology


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
