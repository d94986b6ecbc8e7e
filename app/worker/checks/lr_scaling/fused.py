"""A seed's rule runs of the built-in model trained together, one batched step for all of them.

The rules' runs of one seed start from the same weights and read the same batches; they differ
only in their lr (each rule's, along the same schedule). At the probe's small batches a step is
all per-operation overhead, so R runs stacked along a leading dimension (batched matmuls, one
flat tensor of every run's weights) cost little more than one: the probe's three rules at
global 16 were two thirds of its longest rank. Each run's arithmetic is its own (its rows of
the batched products, its elements of the update, its lr, its own clipping norm), so its curve
is the run's alone, equal to training it by itself to rounding (tests hold it to 1e-12).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from app.contract.kinds.lr_scaling import ProbeRunSpec
from app.core.learning_rate.recipe_summary import lr_of
from app.worker.checks.lr_scaling.gradients import flat_views
from app.worker.checks.lr_scaling.updates import Update
from app.worker.checks.lr_scaling.verdict import LossCurve


def together_key(run: ProbeRunSpec) -> tuple[Any, ...]:
    """Runs with equal keys can be trained together: the same batches and the same optimizer,
    whatever their lr."""
    r = run.recipe
    return (
        run.batch_size,
        r.optimizer,
        r.momentum,
        r.nesterov,
        r.betas,
        r.eps,
        r.weight_decay,
        r.max_grad_norm,
    )


class StackedNets:
    """R copies of the built-in model (Linear, Tanh, Linear), their weights views of one flat
    tensor, block by block (every run's first weight, then every run's first bias, ...)."""

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        per_run = [[p.detach() for p in m.parameters()] for m in modules]
        blocks = [torch.stack([weights[j] for weights in per_run]) for j in range(4)]
        self.runs = len(modules)
        self.flat = torch.cat([b.reshape(-1) for b in blocks])
        self.grad = torch.empty_like(self.flat)
        self.w1, self.b1, self.w2, self.b2 = flat_views(self.flat, blocks)
        self.grads = flat_views(self.grad, blocks)
        # Each element's run: an lr (or a clipping factor) per run, spread over the flat tensor.
        self.run_of = torch.cat([torch.arange(self.runs).repeat_interleave(b[0].numel()) for b in blocks]).to(
            self.flat.device
        )
        self._one = torch.ones((), dtype=self.flat.dtype, device=self.flat.device)

    def _forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        wide = x.expand(self.runs, *x.shape)
        hidden = torch.tanh(torch.baddbmm(self.b1.unsqueeze(1), wide, self.w1.transpose(1, 2)))
        return hidden, torch.baddbmm(self.b2.unsqueeze(1), hidden, self.w2.transpose(1, 2))

    def gradient(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Every run's gradient of its mean half squared error on (x, y), into `grad`."""
        hidden, prediction = self._forward(x)
        out = (prediction - y).div_(x.shape[0])
        inner = torch.bmm(out, self.w2).mul_(torch.addcmul(self._one, hidden, hidden, value=-1))
        g_w1, g_b1, g_w2, g_b2 = self.grads
        torch.bmm(inner.transpose(1, 2), x.expand(self.runs, *x.shape), out=g_w1)
        torch.sum(inner, 1, out=g_b1)
        torch.bmm(out.transpose(1, 2), hidden, out=g_w2)
        torch.sum(out, 1, out=g_b2)
        return self.grad

    def clipped(self, grad: torch.Tensor, max_norm: float) -> torch.Tensor:
        """clip_grad_norm_'s arithmetic, each run by its own total norm."""
        norms = torch.stack([torch.linalg.vector_norm(g.reshape(self.runs, -1), dim=1) for g in self.grads])
        total = torch.linalg.vector_norm(norms, dim=0)
        factor = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        return grad.mul(factor[self.run_of])

    def held_out_losses(self, x: torch.Tensor, y: torch.Tensor) -> list[float | None]:
        with torch.no_grad():
            _, prediction = self._forward(x)
            losses = (0.5 * ((prediction - y) ** 2).sum(dim=2)).mean(dim=1).tolist()
        return [v if math.isfinite(v) else None for v in losses]


def train_together(
    runs: Sequence[ProbeRunSpec],
    modules: Sequence[nn.Module],
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    held_out: tuple[torch.Tensor, torch.Tensor],
    samples: int,
    global_batch: int,
    points: Sequence[int],
) -> list[LossCurve]:
    """Each run's held-out loss curve, as the probe's own loop draws it for one run."""
    nets = StackedNets(modules)
    update = Update(runs[0].recipe, [nets.flat])
    max_norm = runs[0].recipe.max_grad_norm
    b = runs[0].batch_size
    start = nets.held_out_losses(*held_out)
    curves: list[LossCurve] = [[(0, v)] for v in start]
    diverged = [v is None for v in start]
    left = list(points[1:])
    rates, rate_step = nets.flat.new_zeros(nets.flat.shape), -1
    with torch.no_grad():
        for j in range(samples // b):
            if all(diverged):
                break
            if (j * b) // global_batch != rate_step:  # the lr moves once per optimizer step of the plan
                rate_step = (j * b) // global_batch
                each = [lr_of(run.recipe, rate_step) for run in runs]
                rates = torch.tensor(each, dtype=nets.flat.dtype, device=nets.flat.device)[nets.run_of]
            grad = nets.gradient(*next(batches))
            update.step([grad if max_norm is None else nets.clipped(grad, max_norm)], rates)
            consumed = (j + 1) * b
            while left and left[0] <= consumed:
                left.pop(0)
                for r, value in enumerate(nets.held_out_losses(*held_out)):
                    curves[r].append((consumed, None if diverged[r] else value))
                    diverged[r] = diverged[r] or value is None
    for curve in curves:
        curve += [(p, None) for p in left]  # after every run diverged: no loss to show
    return curves
