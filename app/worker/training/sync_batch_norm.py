"""SyncBatchNorm, which the batch-norm finding recommends, in a check.

A SyncBatchNorm layer in training normalises over every process of the forward pass: under
DDP with one micro-batch per replica that is the whole global batch, the same function as a
BatchNorm layer over the whole batch in one process. So the single-process reference (and
the micro-batch search, which runs on rank 0 alone and would otherwise wait for the other
ranks) runs a copy of the model whose SyncBatchNorm layers are BatchNorm again, sharing
their parameters and buffers. torch runs SyncBatchNorm in training on GPUs only: on CPU the
check refuses it before the ranks start (admission) or before any collective (here).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["AnyBatchNorm", "as_batch_norm", "training_sync_batch_norms"]


class AnyBatchNorm(_BatchNorm):
    """BatchNorm for inputs of any rank (N, C, ...), as SyncBatchNorm accepts them."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")


def forward_is_collective(module: nn.Module) -> bool:
    """Whether the module's forward calls a collective (a training SyncBatchNorm's does): then
    every rank must run as many forwards as its peers, so each control steps through DDP on
    its own instead of sharing a rank's distinct micro-batches (gradients.weighted_gradients)."""
    return bool(training_sync_batch_norms(module))


def training_sync_batch_norms(module: nn.Module) -> list[str]:
    return [
        n or "(root)" for n, m in module.named_modules() if isinstance(m, nn.SyncBatchNorm) and m.training
    ]


def as_batch_norm(module: nn.Module) -> nn.Module:
    """A deep copy of `module` whose SyncBatchNorm layers are BatchNorm layers with the same
    parameters, statistics and mode (`module` itself when it has none)."""
    if not any(isinstance(m, nn.SyncBatchNorm) for m in module.modules()):
        return module
    copied = copy.deepcopy(module)
    return _replace(copied)


def _replace(module: nn.Module) -> nn.Module:
    if isinstance(module, nn.SyncBatchNorm):
        plain = AnyBatchNorm(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats
        )
        if module.affine:
            plain.weight, plain.bias = module.weight, module.bias
        if module.track_running_stats:
            plain.running_mean, plain.running_var = module.running_mean, module.running_var
            plain.num_batches_tracked = module.num_batches_tracked
        plain.train(module.training)
        return plain
    for name, child in module.named_children():
        setattr(module, name, _replace(child))
    return module
