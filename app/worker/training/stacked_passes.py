"""Many steps' gradients from one forward pass over their micro-batches stacked, and one
backward per step of its weighted sum of the micro-batches' mean losses: one set of tensor-
parallel collectives (or of pipeline sends) instead of one per micro-batch.

On a pipeline stage the forward receives the previous stage's activations and sends its own
on; each step's backward receives the gradient of its output from the next stage and sends the
gradient of its input back, stage by stage, as a schedule would for one micro-batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from app.worker.training.workload import Workload

# The distinct micro-batches: sample indices, reduction, and the weight of its mean loss in
# each step.
Units = list[tuple[Sequence[int], str, list[float]]]

# Layers whose output for a sample depends on the other samples of the batch, or on chance:
# stacking micro-batches into one forward would change what each of them computes.
_BATCH_COUPLED = (
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
    nn.modules.dropout._DropoutNd,
)
_SHAPE_SLOTS = 8  # a sent activation's rank and sizes, padded


@dataclass(frozen=True, slots=True)
class Pipeline:
    """This rank's place in its pipeline: the group of its stages and its stage."""

    group: dist.ProcessGroup
    stage: int
    stages: int


def stackable(model: nn.Module, workload: Workload, indices: Sequence[int]) -> bool:
    """Whether stacked micro-batches stay independent samples: a loss function to apply to each
    micro-batch's rows, no layer coupling them, one tensor of inputs and of targets. Decided on
    the whole model, so that every rank of a mesh decides alike."""
    if workload.loss_fn is None or any(isinstance(m, _BATCH_COUPLED) for m in model.modules()):
        return False
    x, y = workload.batch(indices, None, torch.device("cpu"))
    return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)


def stacked_gradients(
    module: nn.Module,
    workload: Workload,
    units: Units,
    steps: int,
    trainable: list[nn.Parameter],
    pipeline: Pipeline | None,
    dtype: torch.dtype,
    device: torch.device,
) -> list[dict[torch.Tensor, torch.Tensor | None]]:
    """Every step's gradients of `trainable` (this rank's share) by parameter."""
    assert workload.loss_fn is not None
    first = pipeline is None or pipeline.stage == 0
    last = pipeline is None or pipeline.stage == pipeline.stages - 1
    batches = [workload.batch(indices, dtype, device) for indices, _, _ in units]
    rows = [len(x) for x, _ in batches]
    if first:
        inputs = torch.cat([x for x, _ in batches])
    else:
        assert pipeline is not None
        inputs = _receive(pipeline, pipeline.stage - 1, dtype, device).requires_grad_()
    output = workload.forward(module, inputs)
    if not last:
        assert pipeline is not None
        _send(output.detach(), pipeline, pipeline.stage + 1)
    losses = torch.zeros(0)
    if last:
        targets = torch.cat([y for _, y in batches])
        losses = torch.stack(
            [
                workload.loss_fn(o, t)
                for o, t in zip(torch.split(output, rows), torch.split(targets, rows), strict=True)
            ]
        )
    weights = torch.tensor([scales for _, _, scales in units], dtype=dtype, device=device).T
    wrt = trainable if first else [*trainable, inputs]
    out: list[dict[torch.Tensor, torch.Tensor | None]] = []
    for s in range(steps):
        if last:
            found = torch.autograd.grad(
                (weights[s].to(losses.dtype) * losses).sum(), wrt, retain_graph=True, allow_unused=True
            )
        else:
            assert pipeline is not None
            downstream = _receive(pipeline, pipeline.stage + 1, output.dtype, device)
            found = torch.autograd.grad(
                output, wrt, grad_outputs=downstream, retain_graph=True, allow_unused=True
            )
        if not first:
            assert pipeline is not None
            upstream = found[-1] if found[-1] is not None else torch.zeros_like(inputs)
            _send(upstream, pipeline, pipeline.stage - 1)
            found = found[:-1]
        out.append(dict(zip(trainable, found, strict=True)))
    return out


def _send(tensor: torch.Tensor, pipeline: Pipeline, stage: int) -> None:
    if tensor.dim() >= _SHAPE_SLOTS:
        raise ValueError(f"an activation of {tensor.dim()} dimensions between pipeline stages")
    shape = [tensor.dim(), *tensor.shape] + [0] * (_SHAPE_SLOTS - 1 - tensor.dim())
    dist.send(
        torch.tensor(shape, dtype=torch.int64, device=tensor.device), group=pipeline.group, group_dst=stage
    )
    dist.send(tensor.contiguous(), group=pipeline.group, group_dst=stage)


def _receive(pipeline: Pipeline, stage: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    shape = torch.zeros(_SHAPE_SLOTS, dtype=torch.int64, device=device)
    dist.recv(shape, group=pipeline.group, group_src=stage)
    dims = [int(d) for d in shape[1 : 1 + int(shape[0])]]
    tensor = torch.empty(dims, dtype=dtype, device=device)
    dist.recv(tensor, group=pipeline.group, group_src=stage)
    return tensor
