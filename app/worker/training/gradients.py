"""The gradients a check compares: DDP's over a step's micro-batches, the single-process one
over the global batch, and a module's own (no all-reduce) over a few batches."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from app.worker.training.synthetic_model import backward, flat_gradient
from app.worker.training.workload import Workload

Batch = tuple[Sequence[int], float, str]  # sample indices, loss scale, reduction


def ddp_gradient(
    model: DistributedDataParallel,
    batches: Sequence[Batch],
    *,
    factor: float,
    workload: Workload,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """One step's gradient: every local micro-batch but the last under `no_sync()`, each loss
    times its scale; the last backward lets DDP all-reduce (a mean over processes).

    `factor` = processes / replicas: a process that runs several replicas sums their
    gradients, and DDP's mean over processes then equals the mean over replicas.
    """
    model.zero_grad(set_to_none=True)
    cache: dict[tuple[int, ...], tuple[Any, Any]] = {}
    for i, (indices, scale, reduction) in enumerate(batches):
        key = tuple(indices)
        if key not in cache:
            # Controls that make every replica read the same samples reuse the same tensors.
            cache = {key: workload.batch(indices, dtype, device)}
        x, y = cache[key]
        with nullcontext() if i == len(batches) - 1 else model.no_sync():
            backward(workload.loss(model, x, y, reduction) * (scale * factor))
    return flat_gradient(model.module).detach().clone()


def reference_gradient(
    workload: Workload, batch: Sequence[int], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """One process, the mean loss over exactly the global batch."""
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
