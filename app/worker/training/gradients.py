"""The gradients a check compares: DDP's over a step's micro-batches, the single-process one
over the global batch, and a module's own (no all-reduce) over a few batches."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from app.worker.training.synthetic_model import backward, flat_gradient
from app.worker.training.workload import Workload

# Sample indices (a list, or a tensor of a pooled replica group's), loss scale, reduction.
Batch = tuple[Sequence[int] | torch.Tensor, float, str]


def _samples(indices: Sequence[int] | torch.Tensor) -> Sequence[int]:
    # A pooled tensor reaches only the built-in workload, whose batch reads index tensors as they are.
    return cast(Sequence[int], indices)


def batch_key(indices: Sequence[int] | torch.Tensor) -> tuple[object, ...]:
    """A key that is equal for the same samples: a list by its values, a tensor by its identity
    (a pooled group's tensor is made once and shared by every run that reads it)."""
    return ("tensor", id(indices)) if isinstance(indices, torch.Tensor) else tuple(indices)


@dataclass(frozen=True, slots=True)
class BatchFeed:
    """How a rank turns a Batch into a backward: the workload's tensors in `dtype` on `device`,
    each loss times its scale and `factor` (processes / replicas, see `micro_steps`)."""

    workload: Workload
    dtype: torch.dtype
    device: torch.device
    factor: float


def micro_steps(model: DistributedDataParallel, batches: Sequence[Batch], feed: BatchFeed) -> float:
    """One step's backward passes: every local micro-batch but the last under `no_sync()`, each
    loss times its scale and `factor`; the last backward lets DDP all-reduce (a mean over
    processes). Returns the sum of the losses times their scales.

    `factor` = processes / replicas: a process that runs several replicas sums their
    gradients, and DDP's mean over processes then equals the mean over replicas.
    """
    workload, factor = feed.workload, feed.factor
    model.zero_grad(set_to_none=True)
    cache: dict[tuple[object, ...], tuple[Any, Any]] = {}
    total = 0.0
    for i, (indices, scale, reduction) in enumerate(batches):
        key = batch_key(indices)
        if key not in cache:
            # Controls that make every replica read the same samples reuse the same tensors.
            cache = {key: workload.batch(_samples(indices), feed.dtype, feed.device)}
        x, y = cache[key]
        with nullcontext() if i == len(batches) - 1 else model.no_sync():
            loss = workload.loss(model, x, y, reduction)
            backward(loss * (scale * factor))
        total += loss.item() * scale
    return total


def ddp_gradient(model: DistributedDataParallel, batches: Sequence[Batch], feed: BatchFeed) -> torch.Tensor:
    """One step's gradient (`micro_steps`), as every process holds it after DDP's all-reduce."""
    micro_steps(model, batches, feed)
    return flat_gradient(model.module).detach().clone()


def weighted_gradients(
    module: torch.nn.Module, runs: Sequence[Sequence[Batch]], feed: BatchFeed
) -> list[torch.Tensor]:
    """What `ddp_gradient` gives for each run's batches, from one backward pass per distinct
    (micro-batch, reduction) on this rank and one all-reduce for every run.

    A step's gradient is linear in its micro-batches' loss scales, so each distinct
    micro-batch's gradient is taken once and every run weighs it by the scales it gives it.
    The module runs without DDP (whose hooks would all-reduce each backward): only for a
    module whose forward makes no collective of its own (no training SyncBatchNorm).
    """
    workload, dtype, device, factor = feed.workload, feed.dtype, feed.device, feed.factor
    units: dict[tuple[tuple[object, ...], str], tuple[Sequence[int] | torch.Tensor, str, list[float]]] = {}
    for r, batches in enumerate(runs):
        for indices, scale, reduction in batches:
            entry = units.setdefault((batch_key(indices), reduction), (indices, reduction, [0.0] * len(runs)))
            entry[2][r] += scale * factor
    parameters = list(module.parameters())
    trainable = [p for p in parameters if p.requires_grad]
    like = flat_gradient(module)  # its size and dtype
    total = torch.zeros(len(runs), like.numel(), dtype=like.dtype, device=device)
    for indices, reduction, weights in units.values():
        x, y = workload.batch(_samples(indices), dtype, device)
        grads = dict(
            zip(
                trainable,
                torch.autograd.grad(workload.loss(module, x, y, reduction), trainable, allow_unused=True),
                strict=True,
            )
        )
        unit = torch.cat(
            [
                g.reshape(-1) if (g := grads.get(p)) is not None else torch.zeros_like(p).reshape(-1)
                for p in parameters
            ]
        )
        total.add_(torch.outer(torch.tensor(weights, dtype=unit.dtype, device=device), unit))
    if runs:
        dist.all_reduce(total)
        total.div_(dist.get_world_size())
    return list(total.unbind(0))


def reference_gradient(
    workload: Workload, batch: Sequence[int], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """One process, the mean loss over exactly the global batch (SyncBatchNorm as BatchNorm:
    rank 0 computes it alone)."""
    model = workload.single_process_module(dtype, device)
    x, y = workload.batch(batch, dtype, device)
    backward(workload.loss(model, x, y, "mean"))
    return flat_gradient(model).detach()


def mean_gradient(
    module: torch.nn.Module,
    workload: Workload,
    batches: Sequence[Sequence[int]],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """The gradient of the mean loss over `batches`, on the module alone (no all-reduce:
    DDP's hooks ignore a backward that did not go through its forward)."""
    module.zero_grad(set_to_none=True)
    total = sum(len(b) for b in batches)
    for b in batches:
        x, y = workload.batch(b, dtype, device)
        backward(workload.loss(module, x, y, "mean") * (len(b) / total))
    gradient = flat_gradient(module).detach().clone()
    module.zero_grad(set_to_none=True)
    return gradient


def compare(grad: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """(max absolute difference, relative L2 difference); the absolute one stands in for the
    relative one when the reference gradient is zero."""
    diff = (grad - reference).double()
    norm = float(reference.double().norm())
    max_abs = float(diff.abs().max())
    return max_abs, float(diff.norm()) / norm if norm > 0 else max_abs
