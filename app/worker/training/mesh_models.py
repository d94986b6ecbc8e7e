"""A mesh rank's share of the model: the device mesh as torchtitan builds it, the pipeline
stage's layers, tensor parallel on the synthetic model's linear pair, and `fully_shard` over
the data-parallel dimensions.

DDP under a mesh is `fully_shard` over (dp_replicate, dp_shard = 1): HSDP with one-rank shards
keeps the whole model on every replica and all-reduces the mean across them, which is DDP's
arithmetic, and it composes with DTensor parameters where DistributedDataParallel does not.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor import _redistribute as dtensor_redistribute
from torch.distributed.tensor import debug as dtensor_debug
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from app.contract.targets import FactoryError, resolve

ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
Parallelize = Callable[[nn.Module, DeviceMesh], nn.Module]


def mesh_names(sizes: dict[str, int]) -> list[str]:
    """Dimensions above 1, plus both data-parallel ones when there is data parallelism (the
    wrapper needs them by name, size 1 or not)."""
    dp = sizes["dp_replicate"] * sizes["dp_shard"]
    keep = {n for n in ORDER if sizes[n] > 1} | ({"dp_replicate", "dp_shard"} if dp > 1 else set())
    return [n for n in ORDER if n in keep] or ["dp_replicate"]


# The meshes built on the current default group, by shape: a warm rank keeps its group from
# one check to the next (rank.kept_group), and a mesh's groups live as long as it does, so each
# shape is built once per group. Bounded by the shapes a world size has.
_meshes: dict[tuple[Any, ...], DeviceMesh] = {}
_meshes_of: list[Any] = []  # the default group they were built on


def build_mesh(sizes: dict[str, int], device: torch.device) -> DeviceMesh:
    names = mesh_names(sizes)
    shape = tuple(sizes[n] for n in names)
    world = dist.group.WORLD
    if not _meshes_of or _meshes_of[0] is not world:
        forget_meshes()
        _meshes_of.append(world)
    key = (device.type, shape, tuple(names))
    if key not in _meshes:
        _meshes[key] = init_device_mesh(device.type, shape, mesh_dim_names=tuple(names))
    return _meshes[key]


# A one-step mesh check never changes a weight (no optimizer step: its runs only take
# gradients), so the parallelised modules it builds serve the next check of the same model on
# the same mesh: parallelising and wrapping cost a quarter of a small check. Kept with the
# mesh they live on, the last KEPT_MODULES used; each use restores the buffers (a forward may
# update them) from the model as built. Building one is collective (distribute_tensor
# scatters from rank 0), so every rank of the group must build at the same checks: the keys
# are the same on every rank (names, never a process's own objects) and every rank of a kept
# group runs the same checks in the same order, so their caches hit and evict alike.
KEPT_MODULES = 8
_modules: OrderedDict[tuple[Any, ...], nn.Module] = OrderedDict()


def kept_module(key: tuple[Any, ...], base: nn.Module, build: Callable[[nn.Module], nn.Module]) -> nn.Module:
    """`build(copy of base)`, kept under `key` (which must name the model and its seed, the
    mesh, the dtype and the split, the same on every rank) while the meshes last, with its
    buffers as `base` holds them."""
    if not _meshes_of:
        raise RuntimeError("kept_module before build_mesh: a module lives on a mesh")
    module = _modules.get(key)
    if module is None:
        module = _modules[key] = build(copy.deepcopy(base))
        while len(_modules) > KEPT_MODULES:
            _modules.popitem(last=False)
        return module
    _modules.move_to_end(key)
    built = dict(base.named_buffers())
    with torch.no_grad():
        for name, buffer in module.named_buffers():
            if name in built:
                buffer.copy_(built[name])
    return module


def forget_meshes() -> None:
    _modules.clear()
    _meshes.clear()
    _meshes_of.clear()
    _forget_dtensor_caches()


def _forget_dtensor_caches() -> None:
    """DTensor caches each op's output sharding (in Python and in its C++ fast path) and each
    redistribution's planner by their specs, and a DeviceMesh equals any mesh of the same ranks,
    shape and names, whatever group it was built on: an answer cached on a torn-down group's
    mesh sent a later check's collectives to groups that are gone ("Could not resolve the
    process group registered under the name 3": an HSDP check, a check on other ranks, then a
    run on the HSDP mesh). torch names these clears private; older releases lack some."""
    for clear in (
        getattr(dtensor_debug, "_clear_sharding_prop_cache", None),
        getattr(dtensor_redistribute, "clear_redistribute_planner_cache", None),
    ):
        if clear is not None:
            clear()


def data_parallel_mesh(mesh: DeviceMesh, sizes: dict[str, int]) -> DeviceMesh | None:
    """What `fully_shard` takes: 1-D for FSDP, 2-D (replicate, shard) for HSDP and DDP."""
    if sizes["dp_replicate"] * sizes["dp_shard"] == 1:
        return None
    if sizes["dp_replicate"] == 1:
        return mesh["dp_shard"]
    return mesh["dp_replicate", "dp_shard"]


def stage_names(layers: list[str], stages: int, stage: int) -> list[str]:
    """Stage `stage`'s contiguous share of the layers, earlier stages one longer when uneven."""
    return layers[stage * len(layers) // stages : (stage + 1) * len(layers) // stages]


def synthetic_parallelize(model: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """The synthetic model's share on this rank: its pipeline stage (child names kept, so
    gradients are named as in the whole model), the linear pair column- then row-wise."""
    names = mesh.mesh_dim_names or ()
    children = list(model.named_children())
    if "pp" in names:
        keep = stage_names([n for n, _ in children], mesh["pp"].size(), mesh["pp"].get_local_rank())
        model = nn.Sequential(OrderedDict((n, c) for n, c in children if n in keep))
    if "tp" in names:
        plan: dict[str, Any] = {"0": ColwiseParallel(), "2": RowwiseParallel()}
        present = {n for n, _ in model.named_children()}
        parallelize_module(model, mesh["tp"], {k: v for k, v in plan.items() if k in present})
    return model


def registered_parallelize(target: str | None) -> Parallelize | None:
    """A registered factory's `parallelize(model, mesh)`, defined next to it, if any."""
    if not target:
        return None
    # Through the one dynamic import (contract.targets.resolve): `parallelize` in the factory's module.
    try:
        found: Parallelize = resolve(f"{target.partition(':')[0]}:parallelize")
    except FactoryError:
        return None
    return found


def shard_data_parallel(model: nn.Module, mesh: DeviceMesh, sizes: dict[str, int]) -> nn.Module:
    dp_mesh = data_parallel_mesh(mesh, sizes)
    if dp_mesh is not None:
        fully_shard(model, mesh=dp_mesh)
    return model


def accumulate(model: nn.Module, last: bool) -> None:
    """Before a micro-batch's backward under `fully_shard`: reduce the gradients on the step's
    last one only, as DDP's no_sync does, and keep the parameters gathered until then (the
    next forward would gather them again; resharding and gathering twice per micro-batch was
    half of a 4-rank FSDP step). Neither changes a gradient. Nothing without the wrapper."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(last)
        model.set_reshard_after_backward(last)


def full_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient by name: `full_tensor()` gathers a sharded one over
    its mesh (every rank of that mesh calls it, in the same order)."""
    out = {}
    for name, parameter in model.named_parameters():
        grad = parameter.grad
        if grad is None:
            grad = torch.zeros_like(parameter)
        if isinstance(grad, DTensor):
            grad = grad.full_tensor()
        out[name] = grad.detach().to("cpu").clone()
    return out


def gathered_gradients(
    runs: list[dict[str, torch.Tensor]], sizes: dict[str, int], dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor]:
    """Every run's named gradients from every rank, flat in the order of `sizes` (each name's
    element count, as built), on rank 0: a stage holds only its layers. One gather of one
    tensor; each name's value is taken, as a dict update in rank order would, from the last
    rank that holds it. The other ranks get an empty list."""
    mine = torch.cat([_row(run, sizes, dtype) for run in runs]).to(device)  # NCCL gathers on the GPU
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())] if dist.get_rank() == 0 else None
    dist.gather(mine, parts, dst=0)
    if parts is None:
        return []
    parts = [p.cpu() for p in parts]
    names, width = len(sizes), len(sizes) + sum(sizes.values())
    merged = torch.zeros(len(runs), width - names, dtype=dtype)
    for part in parts:
        rows = part.reshape(len(runs), width)
        start = 0
        for i, size in enumerate(sizes.values()):
            if bool(rows[0, i]):
                merged[:, start : start + size] = rows[:, names + start : names + start + size]
            start += size
    return list(merged.unbind(0))


def _row(run: dict[str, torch.Tensor], sizes: dict[str, int], dtype: torch.dtype) -> torch.Tensor:
    """One run's row: 1 for each name this rank holds, then the values (zeros where it does not)."""
    held = torch.tensor([1.0 if n in run else 0.0 for n in sizes], dtype=dtype)
    values = [
        run[n].reshape(-1).to(dtype) if n in run else torch.zeros(k, dtype=dtype) for n, k in sizes.items()
    ]
    return torch.cat([held, *values])
