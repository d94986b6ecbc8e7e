"""A probe run's gradient of the mean loss on a batch: by autograd for any model, written out for
the built-in model (two linear layers around a tanh, half the squared error), whose forward and
backward by hand take a third of autograd's per-step overhead at the probe's small batches and
agree with it to rounding (tests/worker/checks/lr_scaling hold a whole run to 1e-12 relative).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from app.worker.training.workload import SyntheticWorkload, Workload

Gradient = Callable[[Any, Any], Sequence[torch.Tensor]]


def gradient_of(work: Workload, module: nn.Module, params: list[torch.Tensor]) -> Gradient:
    """The gradient function for `module`'s trainable `params` (aliases the update writes)."""
    layers = list(module.children())
    if (
        isinstance(work, SyntheticWorkload)
        and len(layers) == 3
        and isinstance(layers[0], nn.Linear)
        and isinstance(layers[1], nn.Tanh)
        and isinstance(layers[2], nn.Linear)
        and len(params) == 4
    ):
        return _two_layers(params)
    trainable = [p for p in module.parameters() if p.requires_grad]

    def by_autograd(x: Any, y: Any) -> Sequence[torch.Tensor]:
        with torch.enable_grad():  # the run's loop holds no_grad for its updates
            return torch.autograd.grad(work.loss(module, x, y, "mean"), trainable)

    return by_autograd


def _two_layers(params: list[torch.Tensor]) -> Gradient:
    w1, b1, w2, b2 = params
    w1t, w2t = w1.t(), w2.t()  # views: they follow the in-place updates

    def by_hand(x: Any, y: Any) -> Sequence[torch.Tensor]:
        hidden = torch.tanh(torch.addmm(b1, x, w1t))
        # d(mean over the batch of half the squared error) / d(prediction)
        out = (torch.addmm(b2, hidden, w2t) - y).div_(x.shape[0])
        inner = (out @ w2).mul_(1 - hidden * hidden)
        return (inner.t() @ x, inner.sum(0), out.t() @ hidden, out.sum(0))

    return by_hand
