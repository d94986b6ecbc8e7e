"""The device mesh a plan runs on, in torchtitan's vocabulary and order.

torchtitan's `ParallelDims` orders the mesh pp, dp_replicate, dp_shard, cp, tp (outermost
first) and leaves out dimensions of size 1; `init_device_mesh` takes exactly that shape. The
data-parallel group is dp_replicate x dp_shard: samplers take its rank and size, never the
global ones, and tensor-, pipeline- and context-parallel peers read the same samples.

`data_parallel_shard` picks the wrapper: 1 is DDP (every replica holds the whole model), the
data-parallel size is FSDP (`fully_shard` over all of it), a proper divisor is HSDP
(`data_parallel_size / data_parallel_shard` replicas, each sharded `data_parallel_shard`
ways). Expert parallelism borrows from the other dimensions and never changes the world size;
its rules are torchtitan's for expert tensor parallel 1 (its default): `expert` is a multiple
of context x tensor and divides data_parallel_shard x context x tensor.
"""

from __future__ import annotations

import functools

from app.core.errors import InvalidValue
from app.core.integers import nearest
from app.core.plan_types import DeviceMeshPlan, MeshDimension, Parallelism, Wrapper
from app.core.records import record

ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
DATA_PARALLEL_DIMS = ("dp_replicate", "dp_shard")


@record
class Coordinates:
    """One global rank's place in the mesh; `dp` is its data-parallel rank."""

    rank: int
    pp: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int

    def dp(self, dp_shard_size: int) -> int:
        return self.dp_replicate * dp_shard_size + self.dp_shard


def wrapper(data_parallel_size: int, shard: int) -> Wrapper:
    if shard == 1:
        return "ddp"
    return "fsdp" if shard == data_parallel_size else "hsdp"


def expert_ok(expert: int, shard: int, parallelism: Parallelism) -> bool:
    borrowed = parallelism.context * parallelism.tensor
    return expert == 1 or (expert % borrowed == 0 and (shard * borrowed) % expert == 0)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def validate(parallelism: Parallelism, data_parallel_size: int) -> None:
    """422s naming the field, with the values that work nearest first."""
    shard, expert = parallelism.data_parallel_shard, parallelism.expert
    if data_parallel_size % shard:
        # Every divisor works for the shard itself; keep those the request's expert size allows.
        fits = [d for d in _divisors(data_parallel_size) if expert_ok(expert, d, parallelism)]
        choices = (
            "1, the only data-parallel rank"
            if data_parallel_size == 1
            else f"1 (DDP), {data_parallel_size} (FSDP) or a divisor in between (HSDP, "
            f"data_parallel_size / data_parallel_shard replicas)"
        )
        raise InvalidValue(
            f"data_parallel_shard {shard} does not divide the data-parallel size "
            f"{data_parallel_size}: use {choices}",
            pointer="/parallelism/data_parallel_shard",
            suggestions={"parallelism.data_parallel_shard": nearest(fits, shard)} if fits else {},
        )
    if not expert_ok(expert, shard, parallelism):
        borrowed = parallelism.context * parallelism.tensor
        limit = shard * borrowed
        fits = [e for e in _divisors(limit) if expert_ok(e, shard, parallelism)]
        raise InvalidValue(
            f"expert {expert} must be a multiple of context x tensor = {borrowed} and divide "
            f"data_parallel_shard x context x tensor = {shard} x {parallelism.context} x "
            f"{parallelism.tensor} = {limit} (torchtitan's ParallelDims, expert tensor parallel 1): "
            f"expert parallelism borrows those ranks and never adds any",
            pointer="/parallelism/expert",
            suggestions={"parallelism.expert": nearest(fits, expert)},
        )


@functools.lru_cache(maxsize=1024)
def device_mesh(parallelism: Parallelism, data_parallel_size: int) -> DeviceMeshPlan:
    """The mesh of a validated plan (call `validate` first). Cached: every plan asks for one,
    and a handful of shapes cover nearly all requests; the result is frozen, safe to share."""
    shard = parallelism.data_parallel_shard
    sizes = {
        "pp": parallelism.pipeline,
        "dp_replicate": data_parallel_size // shard,
        "dp_shard": shard,
        "cp": parallelism.context,
        "tp": parallelism.tensor,
    }
    dims = tuple(MeshDimension(name, sizes[name]) for name in ORDER if sizes[name] > 1)
    # One GPU: init_device_mesh needs a dimension, and a lone replica is plain DDP.
    dims = dims or (MeshDimension("dp_replicate", 1),)
    names = tuple(d.name for d in dims)
    shape = ", ".join(str(d.size) for d in dims)
    quoted = ", ".join(f'"{n}"' for n in names)
    comma = "," if len(dims) == 1 else ""
    return DeviceMeshPlan(
        dimensions=dims,
        data_parallel_dimensions=tuple(n for n in names if n in DATA_PARALLEL_DIMS),
        data_parallel_replicate=sizes["dp_replicate"],
        data_parallel_shard=shard,
        expert=parallelism.expert,
        wrapper=wrapper(data_parallel_size, shard),
        init_device_mesh=(f'init_device_mesh("cuda", ({shape}{comma}), mesh_dim_names=({quoted}{comma}))'),
    )


def full_sizes(mesh: DeviceMeshPlan) -> dict[str, int]:
    """Every dimension of ORDER with its size, 1 for those the mesh leaves out."""
    present = {d.name: d.size for d in mesh.dimensions}
    return {name: present.get(name, 1) for name in ORDER}


def coordinates(mesh: DeviceMeshPlan, rank: int) -> Coordinates:
    """Row-major, as init_device_mesh lays ranks out: the last dimension varies fastest."""
    sizes = full_sizes(mesh)
    place: dict[str, int] = {}
    rest = rank
    for name in reversed(ORDER):
        rest, place[name] = divmod(rest, sizes[name])
    return Coordinates(rank=rank, **place)


def rank_map(mesh: DeviceMeshPlan, world: int) -> list[tuple[int, int, int, int, int]]:
    """(rank, pp, dp, cp, tp) for every rank: what the CLI prints for small worlds."""
    shard = mesh.data_parallel_shard
    out = []
    for rank in range(world):
        c = coordinates(mesh, rank)
        out.append((rank, c.pp, c.dp(shard), c.cp, c.tp))
    return out
