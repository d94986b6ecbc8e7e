"""The mesh arithmetic against an independent statement of torchtitan 0.2.2's ParallelDims rules
(torchtitan/distributed/parallel_dims.py: `_validate` and what `build_mesh` can lay out, with
expert tensor parallel 1), fast and without torchtitan; test_device_mesh_torchtitan.py holds the
plan to the installed ParallelDims itself."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core.cluster.device_mesh import coordinates, rank_map
from app.core.errors.domain import InvalidValue
from app.core.planner import plan
from app.core.records.plan_request import Parallelism, PlanRequest, Topology


def parallel_dims_accepts(
    world: int, dp_replicate: int, dp_shard: int, cp: int, tp: int, pp: int, ep: int
) -> bool:
    """ParallelDims._validate and build_mesh, transcribed (etp = 1): an AssertionError there, or
    an experts' mesh (efsdp x ep = dp_shard x cp x tp) that does not unflatten, is False here."""
    if min(dp_replicate, dp_shard, cp, tp, pp, ep) < 1:
        return False
    if dp_replicate * dp_shard * cp * tp * pp != world:
        return False
    return (dp_shard * cp * tp) % ep == 0


def titan_mesh(dp_replicate: int, dp_shard: int, cp: int, tp: int, pp: int) -> list[tuple[str, int]]:
    """The dimensions torchtitan's mesh builder keeps: degree > 1, in its order."""
    named = [("pp", pp), ("dp_replicate", dp_replicate), ("dp_shard", dp_shard), ("cp", cp), ("tp", tp)]
    return [(n, d) for n, d in named if d > 1]


def request(world: int, **parallel: int) -> PlanRequest:
    return PlanRequest(
        topology=Topology.homogeneous(1, world), global_batch_size=None, micro_batch_size=1,
        parallelism=Parallelism(**parallel),
    )  # fmt: skip


sizes = st.sampled_from([1, 2, 3, 4, 6, 8])


@given(tp=sizes, pp=sizes, cp=st.sampled_from([1, 2]), dp=sizes, shard=sizes, ep=sizes)
def test_validation_and_mesh_agree_with_parallel_dims(
    tp: int, pp: int, cp: int, dp: int, shard: int, ep: int
) -> None:
    world = tp * pp * cp * dp
    par = {"tensor": tp, "pipeline": pp, "context": cp, "data_parallel_shard": shard, "expert": ep}
    replicate = dp // shard if dp % shard == 0 else 0
    accepted = parallel_dims_accepts(world, replicate, shard, cp, tp, pp, ep)
    try:
        mesh = plan(request(world, **par)).device_mesh
    except InvalidValue as err:
        assert not accepted
        field = "data_parallel_shard" if dp % shard else "expert"
        assert err.pointer == f"/parallelism/{field}"
        for value in err.suggestions.get(field, []):
            fixed = {**par, field: value}
            fixed_replicate = dp // fixed["data_parallel_shard"]
            assert parallel_dims_accepts(
                world, fixed_replicate, fixed["data_parallel_shard"], cp, tp, pp, fixed["expert"]
            )
            plan(request(world, **fixed))  # each suggestion plans
        return
    assert accepted
    assert mesh is not None
    expected = titan_mesh(replicate, shard, cp, tp, pp) or [("dp_replicate", 1)]
    assert [(d.name, d.size) for d in mesh.dimensions] == expected
    dims = {"dp_replicate": replicate, "dp_shard": shard}
    assert mesh.data_parallel_dimensions == tuple(n for n, _ in expected if n in dims)
    # torchtitan's fsdp_enabled: FSDP over dp_shard x cp, HSDP with replicas, else DDP.
    assert mesh.wrapper == ("ddp" if shard == 1 and cp == 1 else "fsdp" if shard == dp else "hsdp")


@given(tp=sizes, pp=sizes, dp=sizes, shard=st.sampled_from([1, 2]))
def test_rank_coordinates_are_row_major(tp: int, pp: int, dp: int, shard: int) -> None:
    """init_device_mesh lays ranks out as arange(world).view(shape): the product of the
    dimension ranges in order, last fastest."""
    if dp % shard:
        return
    world = tp * pp * dp
    mesh = plan(request(world, tensor=tp, pipeline=pp, data_parallel_shard=shard)).device_mesh
    assert mesh is not None
    ranges = [range(n) for n in (pp, dp // shard, shard, 1, tp)]
    for rank, (p, r, s, c, t) in enumerate(itertools.product(*ranges)):
        got = coordinates(mesh, rank)
        assert (got.pp, got.dp_replicate, got.dp_shard, got.cp, got.tp) == (p, r, s, c, t)
    table = rank_map(mesh, world)
    # Every data-parallel rank holds exactly pp x tp global ranks: its model-parallel peers.
    for d in range(dp):
        assert sum(1 for row in table if row[2] == d) == pp * tp


def test_explanation_names_the_data_parallel_sampler() -> None:
    planned = plan(request(16, tensor=2, data_parallel_shard=2))
    text = " ".join(planned.explanation)
    assert "num_replicas=8" in text and "never the global world size and rank" in text
    assert "not 2" in text  # HSDP: the shard group is not the sampler's group


@pytest.mark.parametrize(
    ("parallel", "pointer", "suggested"),
    [
        ({"data_parallel_shard": 3}, "/parallelism/data_parallel_shard", [2, 4, 1, 8]),
        ({"tensor": 2, "expert": 4, "data_parallel_shard": 1}, "/parallelism/expert", [2, 1]),
    ],
)
def test_refusals_name_the_field(parallel: dict[str, int], pointer: str, suggested: list[int]) -> None:
    with pytest.raises(InvalidValue) as caught:
        plan(request(16, **parallel))
    assert caught.value.pointer == pointer
    assert next(iter(caught.value.suggestions.values())) == suggested
