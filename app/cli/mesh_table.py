"""The CLI's view of a plan's device mesh: its dimensions and, for small worlds, which global
rank holds which (pp, dp, cp, tp) coordinate, as torch's init_device_mesh lays them out."""

from __future__ import annotations

from typing import Any

from app.core.cluster.device_mesh import rank_map
from app.core.records.plan import DeviceMeshPlan, MeshDimension

# Beyond this many ranks the map is longer than it is useful.
MAX_MAPPED_RANKS = 64


def _mesh(data: dict[str, Any]) -> DeviceMeshPlan:
    return DeviceMeshPlan(
        dimensions=tuple(MeshDimension(d["name"], d["size"]) for d in data["dimensions"]),
        data_parallel_dimensions=tuple(data["data_parallel_dimensions"]),
        data_parallel_replicate=data["data_parallel_replicate"],
        data_parallel_shard=data["data_parallel_shard"],
        expert=data["expert"],
        wrapper=data["wrapper"],
        init_device_mesh=data["init_device_mesh"],
    )


def mesh_lines(result: dict[str, Any]) -> list[str]:
    data = result.get("device_mesh")
    if not data or (data["wrapper"] == "ddp" and result["model_parallel_size"] == 1):
        return []  # plain DDP: the global rank is the data-parallel rank
    mesh = _mesh(data)
    shape = " x ".join(f"{d.name} {d.size}" for d in mesh.dimensions)
    lines = ["", f"device mesh {shape} ({mesh.wrapper}); sampler rank = dp"]
    world = result["world_size"]
    if world <= MAX_MAPPED_RANKS and world > 1:
        lines.append(f"{'rank':>6}  {'pp':>3} {'dp':>4} {'cp':>3} {'tp':>3}")
        lines += [f"{r:>6}  {pp:>3} {dp:>4} {cp:>3} {tp:>3}" for r, pp, dp, cp, tp in rank_map(mesh, world)]
    return lines


def check_mesh_lines(result: dict[str, Any]) -> list[str]:
    """The mesh a check ran, one process per mesh rank; nothing for a plain DDP check."""
    mesh = result.get("mesh")
    if not mesh:
        return []
    shape = " x ".join(f"{n} {z}" for n, z in zip(mesh["names"], mesh["sizes"], strict=True))
    return [f"  mesh {shape}, wrapped as {result.get('wrapper', 'ddp')}, one process per mesh rank"]
