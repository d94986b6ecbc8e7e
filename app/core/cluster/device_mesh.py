"""The device mesh a plan runs on, in torchtitan's vocabulary and order.

The rules are torchtitan 0.2.2's `ParallelDims` (distributed/parallel_dims.py), the release the
torchtitan export writes its TOML job config for (0.3 reads no TOML); 0.3.0's ParallelDims
keeps both rules below. tests/core/test_device_mesh_torchtitan.py builds the installed one on
a few thousand random layouts and holds every plan's mesh to it.

torchtitan orders the mesh pp, dp_replicate, dp_shard, cp, tp (outermost first) and leaves out
dimensions of size 1; `init_device_mesh` takes exactly that shape. The data-parallel group is
dp_replicate x dp_shard: samplers take its rank and size, never the global ones, and tensor-,
pipeline- and context-parallel peers read the same samples.

The wrapper is the one torchtitan applies (`fsdp_enabled`): FSDP over dp_shard x cp (its `fsdp`
mesh) whenever either is above 1, HSDP when dp_replicate is above 1 too, else DDP over
dp_replicate. So `data_parallel_shard` 1 is DDP only without context parallel: context-parallel
ranks hold one replica's shards (FSDP's all-gather and reduce-scatter run over them even with
no data parallelism). Expert parallelism borrows from the other dimensions and never changes
the world size: with expert tensor parallel 1 (torchtitan's default, and 0.3's only mode) the
experts' mesh is efsdp x ep = data_parallel_shard x context x tensor, so `expert` divides that
product (0.2.0 also wanted a multiple of context x tensor; 0.2.2 and 0.3.0 do not).
"""

from __future__ import annotations

import functools

from app.core.errors.domain import InvalidValue
from app.core.records.integers import nearest
from app.core.records.plan import DeviceMeshPlan, MeshDimension, Wrapper
from app.core.records.plan_request import Parallelism
from app.core.records.record import record

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


def wrapper(data_parallel_size: int, shard: int, context: int = 1) -> Wrapper:
    """torchtitan's: FSDP when dp_shard or cp is above 1 (HSDP with replicas), else DDP."""
    if shard == 1 and context == 1:
        return "ddp"
    return "fsdp" if shard == data_parallel_size else "hsdp"


def expert_ok(expert: int, shard: int, parallelism: Parallelism) -> bool:
    return (shard * parallelism.context * parallelism.tensor) % expert == 0


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
        limit = shard * parallelism.context * parallelism.tensor
        raise InvalidValue(
            f"expert {expert} must divide data_parallel_shard x context x tensor = {shard} x "
            f"{parallelism.context} x {parallelism.tensor} = {limit} (torchtitan's ParallelDims, "
            f"expert tensor parallel 1: its experts' mesh is efsdp x ep = that product): expert "
            f"parallelism borrows those ranks and never adds any",
            pointer="/parallelism/expert",
            suggestions={"parallelism.expert": nearest(_divisors(limit), expert)},
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
        wrapper=wrapper(data_parallel_size, shard, parallelism.context),
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
