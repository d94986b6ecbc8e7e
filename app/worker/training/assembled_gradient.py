"""A mesh step's whole gradient from every rank's shards in one all-reduce, where
`full_tensor()` on each parameter costs a collective (two, for FSDP beside tensor parallel)
and the gather of the results one more.

Each rank adds its shard of each gradient at the shard's place in the whole tensor; along a
mesh dimension the gradient is replicated on, only the last coordinate adds it (the value
`full_tensor()` then the last holder's copy would give), and a pipeline stage adds only the
parameters it holds. A placement this does not assemble (a partial sum, a strided shard on a
dimension above 1, a plain tensor whose holders a rank cannot know) makes every rank fall back,
decided together in the same all-reduce.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard


def assembled_gradient(
    module: nn.Module, numels: dict[str, int], dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """The whole model's gradient, flat in the order of `numels` (every parameter by name), on
    every rank; None on every rank when some rank holds a gradient it cannot place."""
    held = dict(module.named_parameters())
    parts: list[torch.Tensor] = []
    placeable = True
    for name, numel in numels.items():
        parameter = held.get(name)
        whole = _placed(parameter) if parameter is not None else None
        if parameter is not None and whole is None:
            placeable = False
        parts.append(
            whole.reshape(-1).to(dtype)
            if whole is not None
            else torch.zeros(numel, dtype=dtype, device=device)
        )
    flat = torch.cat([*parts, torch.tensor([0.0 if placeable else 1.0], dtype=dtype, device=device)])
    dist.all_reduce(flat)
    return None if float(flat[-1]) else flat[:-1]


def _placed(parameter: torch.Tensor) -> torch.Tensor | None:
    grad = parameter.grad
    if grad is None:  # no gradient: zeros, as full_gradients gives it
        return torch.zeros(parameter.shape, dtype=parameter.dtype, device=parameter.device)
    if not isinstance(grad, DTensor):
        return None
    return placed(grad)


def placed(grad: DTensor) -> torch.Tensor | None:
    """This rank's part of a DTensor's whole value, in a tensor of zeros of its whole shape:
    its shard at the shard's place, a replicated value only at the last coordinate of its mesh
    dimension; None for a placement this does not place."""
    mesh, coordinate = grad.device_mesh, grad.device_mesh.get_coordinate()
    whole = torch.zeros(grad.shape, dtype=grad.dtype, device=grad.to_local().device)
    if coordinate is None:
        return whole
    region = [slice(None)] * grad.dim()
    for axis, placement in enumerate(grad.placements):
        size = mesh.size(axis)
        if size == 1:
            continue
        if placement.is_replicate():
            if coordinate[axis] != size - 1:
                return whole
        elif type(placement) is Shard and region[placement.dim] == slice(None):
            n = grad.shape[placement.dim]
            chunk = -(-n // size)  # torch.chunk's split, as Shard places it
            start = min(coordinate[axis] * chunk, n)
            region[placement.dim] = slice(start, min(start + chunk, n))
        else:
            return None
    local = grad.to_local()
    target = whole[tuple(region)]
    if target.shape != local.shape:
        return None
    target.copy_(local)
    return whole
