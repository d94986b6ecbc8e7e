"""Many steps' gradients on a tensor-parallel share of the model, from one backward pass per
distinct micro-batch and one all-reduce for them all: what a mesh check's controls need.

A step's gradient is linear in its micro-batches' loss scales, and the data-parallel wrapper
only averages the replicas' sums; so each distinct micro-batch's local gradient is taken once
(on the module before `fully_shard`, whose hooks would reduce every backward), every step
weighs it by the scales it gives it, and one all-reduce over the whole mesh both averages the
replicas and assembles the tensor-parallel shards: each rank adds its shard of a parameter at
the shard's place in the whole tensor (a replicated one from the last tensor rank only, the
value `full_tensor()` then the last rank's gather would report).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from app.worker.training.workload import Workload

# One micro-batch of a step: a key, its sample indices, its loss scale and its reduction. The
# tensor-parallel peers must run the same passes in the same order: a key of None shares the
# pass with every other unit of the same samples (for reads that are the same on the peers),
# any other key only with units of that key.
Unit = tuple[Hashable | None, Sequence[int], float, str]


def weighted_mesh_gradients(
    module: nn.Module,
    steps: Sequence[Sequence[Unit]],
    *,
    workload: Workload,
    replicas: int,
    tensor_rank: int,
    tensor_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> list[torch.Tensor]:
    """Each step's whole gradient, averaged over the data-parallel replicas, flat in the order
    of `module.named_parameters()`; the same on every rank."""
    weights: dict[Hashable, tuple[Sequence[int], str, list[float]]] = {}
    for s, units in enumerate(steps):
        for key, indices, scale, reduction in units:
            # A sum over samples is their mean times their number: one pass serves both.
            weight = scale * len(indices) if reduction == "sum" else scale
            passes = "mean" if reduction == "sum" else reduction
            same = (tuple(indices) if key is None else (key,), passes)
            weights.setdefault(same, (indices, passes, [0.0] * len(steps)))[2][s] += weight
    named = list(module.named_parameters())
    trainable = [p for _, p in named if p.requires_grad]
    sizes = [p.numel() for _, p in named]
    total = torch.zeros(len(steps), sum(sizes), dtype=dtype, device=device)

    def whole(grads: dict[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
        return torch.cat([_placed(grads.get(p), p, tensor_rank, tensor_size).reshape(-1) for _, p in named])

    shared = _one_forward(module, workload, list(weights.values()), len(steps), trainable, dtype, device)
    if shared is not None:
        for s, grads in enumerate(shared):
            total[s] = whole(grads).to(dtype)
    else:
        for indices, reduction, scales in weights.values():
            x, y = workload.batch(indices, dtype, device)
            found = torch.autograd.grad(workload.loss(module, x, y, reduction), trainable, allow_unused=True)
            unit = whole(dict(zip(trainable, found, strict=True))).to(dtype)
            total.add_(torch.outer(torch.tensor(scales, dtype=dtype, device=device), unit))
    if steps:
        dist.all_reduce(total)
        total.div_(replicas)
    return list(total.unbind(0))


# Layers whose output for a sample depends on the other samples of the batch, or on chance:
# stacking micro-batches into one forward would change what each of them computes.
_BATCH_COUPLED = (
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
    nn.modules.dropout._DropoutNd,
)


def _one_forward(
    module: nn.Module,
    workload: Workload,
    units: list[tuple[Sequence[int], str, list[float]]],
    steps: int,
    trainable: list[nn.Parameter],
    dtype: torch.dtype,
    device: torch.device,
) -> list[dict[torch.Tensor, torch.Tensor | None]] | None:
    """Every step's gradients from one forward pass over all the micro-batches stacked (one
    set of tensor-parallel collectives instead of one per micro-batch) and one backward per
    step of its weighted sum of their mean losses; None where the stacked rows would not be
    independent samples (a layer coupling them, the model's own loss, inputs that are not one
    tensor)."""
    if workload.loss_fn is None or any(isinstance(m, _BATCH_COUPLED) for m in module.modules()):
        return None
    batches = [workload.batch(indices, dtype, device) for indices, _, _ in units]
    if not all(isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) for x, y in batches):
        return None
    rows = [len(x) for x, _ in batches]
    output = workload.forward(module, torch.cat([x for x, _ in batches]))
    targets = torch.cat([y for _, y in batches])
    losses = torch.stack(
        [
            workload.loss_fn(o, t)
            for o, t in zip(torch.split(output, rows), torch.split(targets, rows), strict=True)
        ]
    )
    weights = torch.tensor([scales for _, _, scales in units], dtype=losses.dtype, device=device).T
    out: list[dict[torch.Tensor, torch.Tensor | None]] = []
    for s in range(steps):
        found = torch.autograd.grad(
            (weights[s] * losses).sum(), trainable, retain_graph=s < steps - 1, allow_unused=True
        )
        out.append(dict(zip(trainable, found, strict=True)))
    return out


def _placed(
    grad: torch.Tensor | None, parameter: torch.Tensor, tensor_rank: int, tensor_size: int
) -> torch.Tensor:
    """This rank's share of a parameter's whole gradient: its shard at the shard's place, or
    the whole of a replicated one from the last tensor rank (zeros elsewhere)."""
    whole = torch.zeros(parameter.shape, dtype=parameter.dtype, device=parameter.device)
    if grad is None:
        return whole
    placements = grad.placements if isinstance(grad, DTensor) else ()
    local = grad.to_local() if isinstance(grad, DTensor) else grad
    shards = [p for p in placements if isinstance(p, Shard)]
    if not shards:
        return local if tensor_rank == tensor_size - 1 else whole
    if len(placements) != 1:
        raise ValueError(f"a gradient sharded over {len(placements)} mesh dimensions: {placements}")
    dim = shards[0].dim
    # torch.chunk's split, as Shard places it: ceil(n / size) per rank, the last ones shorter.
    chunk = -(-parameter.shape[dim] // tensor_size)
    start = min(tensor_rank * chunk, parameter.shape[dim])
    whole.narrow(dim, start, local.shape[dim]).copy_(local)
    return whole
