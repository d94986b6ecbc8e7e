"""DeepSpeed's batch-size rule as the oracle for even splits.

`deepspeed_batch_config` restates DeepSpeed's `DeepSpeedConfig._set_batch_related_parameters`
and `_batch_assertion` (deepspeed/runtime/config.py): which of train_batch_size,
train_micro_batch_size_per_gpu and gradient_accumulation_steps may be missing, how the
missing one is inferred, and the final check
`train_batch_size == micro × gradient_accumulation_steps × data_parallel_world_size`.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from plan_helpers import examples, try_plan

from app.core.records.plan_request import PlanRequest, Topology


def deepspeed_batch_config(
    train: int | None, micro: int | None, gas: int | None, world: int
) -> tuple[int, int, int] | None:
    """(train_batch_size, micro, gradient_accumulation_steps) as DeepSpeed resolves them,
    or None where DeepSpeed's config would raise."""
    if train is not None and micro is not None and gas is not None:
        pass
    elif train is not None and micro is not None:
        gas = train // micro // world
    elif train is not None and gas is not None:
        micro = train // world // gas
    elif micro is not None and gas is not None:
        train = micro * gas * world
    elif train is not None:
        gas = 1
        micro = train // world
    elif micro is not None:
        train = micro * world
        gas = 1
    else:
        return None
    assert train is not None and micro is not None and gas is not None
    if train <= 0 or micro <= 0 or gas <= 0 or train != micro * gas * world:
        return None
    return train, micro, gas


optional_count = st.one_of(st.none(), st.integers(1, 64))


@examples(300)
@given(
    world=st.integers(1, 64),
    train=st.one_of(st.none(), st.integers(1, 4096)),
    micro=optional_count,
    gas=st.one_of(st.none(), st.integers(1, 16)),
)
def test_even_split_agrees_with_deepspeed(
    world: int, train: int | None, micro: int | None, gas: int | None
) -> None:
    oracle = deepspeed_batch_config(train, micro, gas, world)
    request = PlanRequest(
        topology=Topology.homogeneous(world, 1),
        global_batch_size=train,
        micro_batch_size=micro,
        gradient_accumulation_steps=gas,
    )
    result = try_plan(request) if (train, micro) != (None, None) else None
    if oracle is None:
        assert result is None, f"DeepSpeed rejects {train=} {micro=} {gas=} {world=}; the planner did not"
        return
    assert result is not None, f"DeepSpeed accepts {train=} {micro=} {gas=} {world=} as {oracle}"
    assert (result.global_batch_size, result.micro_batch_size, result.gradient_accumulation_steps) == oracle
    assert result.data_parallel_size == world


@examples(150)
@given(world=st.integers(1, 64), micro=st.integers(1, 64), gas=st.integers(1, 16))
def test_deepspeed_triad_holds_for_every_even_plan(world: int, micro: int, gas: int) -> None:
    for request in (
        PlanRequest(
            topology=Topology.homogeneous(world, 1), micro_batch_size=micro, gradient_accumulation_steps=gas
        ),
        PlanRequest(topology=Topology.homogeneous(world, 1), global_batch_size=micro * gas * world),
        PlanRequest(topology=Topology.homogeneous(world, 1), micro_batch_size=micro),
    ):
        result = try_plan(request)
        assert result is not None
        train, m, g = result.global_batch_size, result.micro_batch_size, result.gradient_accumulation_steps
        assert m is not None
        assert deepspeed_batch_config(train, m, g, world) == (train, m, g)
        # Each replica's loss scale on an even split is 1 / accumulation.
        assert all(group.loss_scale == 1 / g for group in result.replica_groups)
