"""Every suggested value, substituted into the request with everything else unchanged, works."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from plan_helpers import examples, requests, try_plan

from app.core.errors.domain import PlanError, TopologyError
from app.core.planner import plan
from app.core.records.plan_request import Divisibility, Parallelism, PlanRequest, Topology

TRIAD = ("global_batch_size", "micro_batch_size", "gradient_accumulation_steps")
WINDOW = 200  # how far the brute-force search looks on either side


def rejection(request: PlanRequest) -> PlanError | None:
    try:
        plan(request)
    except PlanError as err:
        return err
    return None


def works_with(request: PlanRequest, field: str, value: int) -> bool:
    return try_plan(replace(request, **{field: value})) is not None


def nearest_working(request: PlanRequest, field: str, start: int, step: int) -> int | None:
    value = start
    for _ in range(WINDOW):
        if value < 1:
            return None
        if works_with(request, field, value):
            return value
        value += step
    return None


def substituted(request: PlanRequest, key: str, value: int) -> PlanRequest:
    """The request with the field a suggestion's key names (its path in the JSON request)
    set to `value`, as a client would send it."""
    section, _, rest = key.partition(".")
    if section == "parallelism":
        return replace(request, parallelism=replace(request.parallelism, **{rest: value}))
    if section == "topology" and rest.startswith("node_groups."):
        index, field = rest.removeprefix("node_groups.").split(".")
        groups = list(request.topology.node_groups)
        groups[int(index)] = replace(groups[int(index)], **{field: value})
        return replace(request, topology=replace(request.topology, node_groups=tuple(groups)))
    if section == "topology":
        assert not request.topology.listed_groups, key
        [group] = request.topology.node_groups
        shape = {"num_nodes": group.num_nodes, "gpus_per_node": group.gpus_per_node, rest: value}
        return replace(request, topology=Topology.homogeneous(**shape))
    assert not rest, key
    return replace(request, **{section: value})


def assert_suggestions_hold(request: PlanRequest, err: PlanError) -> None:
    for field in TRIAD:
        values = err.suggestions.get(field, [])
        for value in values:
            assert works_with(request, field, value), f"suggested {field}={value} does not work"
        asked = getattr(request, field)
        if asked is None or not values:
            continue
        if request.divisibility in (Divisibility.ROUND_DOWN, Divisibility.ROUND_UP):
            continue  # suggestions there keep the global batch; nearness is checked for strict policies
        distances = [abs(v - asked) for v in values]
        assert distances == sorted(distances), f"{field} suggestions {values} are not nearest first"
        below = nearest_working(request, field, asked - 1, -1)
        above = nearest_working(request, field, asked + 1, +1)
        if below is not None:
            assert below in values, f"{field}: {below} works, is nearest below {asked}, not in {values}"
        if above is not None:
            assert above in values, f"{field}: {above} works, is nearest above {asked}, not in {values}"
    # Every other suggestion names a field of the request too (GPU counts, parallel sizes), and works.
    for key, values in err.suggestions.items():
        for value in values:
            assert try_plan(substituted(request, key, value)) is not None, (
                f"suggested {key}={value} does not work"
            )


@examples(150)
@given(request=requests())
def test_suggested_values_make_the_request_feasible(request: PlanRequest) -> None:
    err = rejection(request)
    if err is None or not err.suggestions:
        return
    assert_suggestions_hold(request, err)


@pytest.mark.parametrize(
    ("fields", "expected_fields"),
    [
        ({"global_batch_size": 1000, "micro_batch_size": 32}, {"global_batch_size"}),
        ({"global_batch_size": 1000}, {"global_batch_size"}),
        ({"global_batch_size": 520, "gradient_accumulation_steps": 3}, {"global_batch_size"}),
        (
            {"global_batch_size": 512, "micro_batch_size": 8, "gradient_accumulation_steps": 3},
            {"global_batch_size", "gradient_accumulation_steps"},  # no micro-batch works with 3 steps
        ),
        (
            {"global_batch_size": 512, "micro_batch_size": 64, "max_micro_batch_size": 16},
            {"micro_batch_size"},
        ),
    ],
)
def test_infeasible_sixteen_gpu_requests_suggest_working_values(
    fields: dict[str, int], expected_fields: set[str]
) -> None:
    request = PlanRequest(topology=Topology.homogeneous(2, 8), **fields)  # type: ignore[arg-type]
    err = rejection(request)
    assert err is not None
    assert expected_fields <= set(err.suggestions)
    assert_suggestions_hold(request, err)


def test_global_suggestions_sit_below_and_above_the_request() -> None:
    request = PlanRequest(topology=Topology.homogeneous(2, 8), global_batch_size=1000, micro_batch_size=32)
    err = rejection(request)
    assert err is not None
    values = err.suggestions["global_batch_size"]
    assert any(v < 1000 for v in values) and any(v > 1000 for v in values)


def test_round_down_with_nothing_below_is_a_422_not_zero() -> None:
    request = PlanRequest(
        topology=Topology.homogeneous(2, 8), global_batch_size=8, divisibility=Divisibility.ROUND_DOWN
    )
    err = rejection(request)
    assert err is not None and err.pointer == "/global_batch_size"
    assert all(works_with(request, "global_batch_size", v) for v in err.suggestions["global_batch_size"])


# ------------------------------------------------------------------- Megatron-style sizes


@examples(100)
@given(
    num_nodes=st.integers(1, 16),
    gpus_per_node=st.sampled_from([1, 2, 3, 4, 6, 8]),
    tensor=st.integers(1, 8),
    pipeline=st.integers(1, 4),
    context=st.integers(1, 2),
    per_replica=st.integers(1, 8),
)
def test_data_parallel_size_is_world_over_model_parallel(
    num_nodes: int, gpus_per_node: int, tensor: int, pipeline: int, context: int, per_replica: int
) -> None:
    world = num_nodes * gpus_per_node
    mp = tensor * pipeline * context
    parallelism = Parallelism(tensor=tensor, pipeline=pipeline, context=context)
    request = PlanRequest(
        topology=Topology.homogeneous(num_nodes, gpus_per_node),
        micro_batch_size=per_replica,
        parallelism=parallelism,
    )
    err = rejection(request)
    if world % mp == 0:
        assert err is None
        result = plan(request)
        assert (result.model_parallel_size, result.data_parallel_size) == (mp, world // mp)
        assert result.global_batch_size == per_replica * (world // mp)
        return
    assert isinstance(err, TopologyError)
    assert err.pointer.startswith("/parallelism")
    assert str(mp) in err.detail and str(world) in err.detail
    assert err.suggestions, "a world size that the parallel sizes do not divide needs other sizes"
    for key, values in err.suggestions.items():
        assert key.startswith(("topology.", "parallelism.")), key
        current = (
            getattr(request.parallelism, key.split(".")[1], None) if key.startswith("parallelism") else None
        )
        if current is None:
            current = getattr(request.topology.node_groups[0], key.split(".")[1])
        distances = [abs(v - current) for v in values]
        assert distances == sorted(distances) and current not in values, (key, values)
        for value in values:
            fixed = substituted(request, key, value)
            assert fixed.topology.world_size % fixed.parallelism.model_parallel_size == 0
            assert try_plan(fixed) is not None, f"{key} {value} does not work"


def test_megatron_tp4_pp2_on_32_gpus_gives_four_replicas() -> None:
    result = plan(
        PlanRequest(
            topology=Topology.homogeneous(4, 8),
            parallelism=Parallelism(tensor=4, pipeline=2),
            global_batch_size=1024,
            max_micro_batch_size=16,
        )
    )
    assert (result.world_size, result.model_parallel_size, result.data_parallel_size) == (32, 8, 4)
    assert result.micro_batch_size * result.gradient_accumulation_steps * 4 == 1024
    assert result.micro_batch_size <= 16
