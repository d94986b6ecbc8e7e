"""A probe run's trainable weights and its gradient of the mean loss on a batch: by autograd for
any model, written out for the built-in model (two linear layers around a tanh, half the
squared error), whose forward and backward by hand take a third of autograd's per-step overhead
at the probe's small batches and agree with it to rounding (tests/worker/checks/lr_scaling hold
a whole run to 1e-12 relative).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from app.worker.training.workload import SyntheticWorkload, Workload

Gradient = Callable[[Any, Any], Sequence[torch.Tensor]]
NormSq = Callable[[Any, Any], float]  # the squared norm of the mean loss's gradient on a batch


class Trainable(NamedTuple):
    params: list[torch.Tensor]  # what an update steps: aliases of the module's trainable weights
    gradient: Gradient  # one gradient per tensor of `params`, in their order
    written_out: bool  # the built-in model's gradient by hand, not autograd's


def trainable(work: Workload, module: nn.Module) -> Trainable:
    """What a run of `module` steps, and how its gradient is taken."""
    layers = list(module.children())
    weights = [p for p in module.parameters() if p.requires_grad]
    if (
        isinstance(work, SyntheticWorkload)
        and len(layers) == 3
        and isinstance(layers[0], nn.Linear)
        and isinstance(layers[1], nn.Tanh)
        and isinstance(layers[2], nn.Linear)
        and len(weights) == 4
    ):
        return Trainable(*_two_layers(weights), written_out=True)

    def by_autograd(x: Any, y: Any) -> Sequence[torch.Tensor]:
        with torch.enable_grad():  # the run's loop holds no_grad for its updates
            return torch.autograd.grad(work.loss(module, x, y, "mean"), weights)

    return Trainable([p.detach() for p in weights], by_autograd, written_out=False)


def flat_views(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Views of `flat`, one after another, shaped as the tensors of `like`."""
    out, at = [], 0
    for t in like:
        out.append(flat[at : at + t.numel()].view_as(t))
        at += t.numel()
    return out


def _two_layers(weights: list[nn.Parameter]) -> tuple[list[torch.Tensor], Gradient]:
    """One flat tensor holds the four weights (the module's parameters become views of it) and
    one the four gradients, each written in place: an optimizer step is then a few operations on
    one tensor instead of a few on each of four, which was a third of a probe step's time. The
    arithmetic per element is the same."""
    with torch.no_grad():
        flat = torch.cat([p.reshape(-1) for p in weights])
    grad = torch.empty_like(flat)
    for p, view in zip(weights, flat_views(flat, weights), strict=True):
        p.data = view
    w1, b1, w2, b2 = (p.detach() for p in weights)
    g_w1, g_b1, g_w2, g_b2 = flat_views(grad, weights)
    w1t, w2t = w1.t(), w2.t()  # views: they follow the in-place updates
    one = torch.ones((), dtype=flat.dtype, device=flat.device)

    def by_hand(x: Any, y: Any) -> Sequence[torch.Tensor]:
        hidden = torch.tanh(torch.addmm(b1, x, w1t))
        # d(mean over the batch of half the squared error) / d(prediction)
        out = (torch.addmm(b2, hidden, w2t) - y).div_(x.shape[0])
        # tanh' = 1 - hidden^2 in one operation (the same rounding: -hidden * hidden is exact)
        inner = (out @ w2).mul_(torch.addcmul(one, hidden, hidden, value=-1))
        torch.mm(inner.t(), x, out=g_w1)
        torch.sum(inner, 0, out=g_b1)
        torch.mm(out.t(), hidden, out=g_w2)
        torch.sum(out, 0, out=g_b2)
        return (grad,)

    return [flat], by_hand


def squared_norm_of(work: Workload, module: nn.Module, by_hand: Gradient | None) -> NormSq:
    """|g|^2 of the mean loss on a batch at the module's weights (for the noise scale): by hand
    where the run's gradient is written out, else by autograd (weights the loss does not use
    count 0)."""
    if by_hand is not None:
        return lambda x, y: float(sum(g.double().pow(2).sum() for g in by_hand(x, y)))
    weights = [p for p in module.parameters() if p.requires_grad]

    def by_autograd(x: Any, y: Any) -> float:
        module.zero_grad(set_to_none=True)
        grads = torch.autograd.grad(work.loss(module, x, y, "mean"), weights, allow_unused=True)
        return float(sum(g.double().pow(2).sum() for g in grads if g is not None))

    return by_autograd
