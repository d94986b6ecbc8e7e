"""The probe's optimizer steps, written out: the same arithmetic as torch.optim's single-tensor
SGD, Adam and AdamW (the ones build_optimizer makes, which is what ran on CPU), without its
per-step wrapper, hooks and parameter-group bookkeeping. At a small batch the optimizer's own
overhead was the largest part of a probe step; tests/worker/checks/lr_scaling hold these to
torch.optim within 1e-12 relative in float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from app.core.records.plan import LearningRatePlan

_DECOUPLED = ("adamw", "lamb")  # build_optimizer makes AdamW for both


Rate = float | torch.Tensor  # one lr, or an lr per element (runs trained together: fused.py)


class Update:
    """One run's optimizer state; `step(grads, lr)` changes `params` in place (under
    torch.no_grad(), which the caller holds for the whole run)."""

    def __init__(self, recipe: LearningRatePlan, params: Sequence[torch.Tensor]) -> None:
        self.params = list(params)
        self.weight_decay = recipe.weight_decay
        self.adam = recipe.betas is not None
        self.decoupled = recipe.optimizer in _DECOUPLED
        self.momentum = 0.9 if recipe.momentum is None else recipe.momentum
        self.nesterov = recipe.nesterov
        self.betas = recipe.betas or (0.9, 0.999)
        self.eps = 1e-8 if recipe.eps is None else recipe.eps
        self.count = 0
        self.first: list[torch.Tensor] = []
        self.second: list[torch.Tensor] = []

    def step(self, grads: Sequence[torch.Tensor], lr: Rate) -> None:
        self.count += 1
        if self.adam:
            self._adam(grads, lr)
        else:
            self._sgd(grads, lr)

    def _sgd(self, grads: Sequence[torch.Tensor], lr: Rate) -> None:
        first = self.count == 1
        for i, (param, raw) in enumerate(zip(self.params, grads, strict=True)):
            grad = raw.add(param, alpha=self.weight_decay) if self.weight_decay != 0 else raw
            if self.momentum != 0:
                if first:
                    self.first.append(torch.clone(grad).detach())
                    buf = self.first[-1]
                else:
                    buf = self.first[i].mul_(self.momentum).add_(grad)
                grad = grad.add(buf, alpha=self.momentum) if self.nesterov else buf
            if isinstance(lr, torch.Tensor):  # param + (-1 * grad) * lr: the same rounding
                param.addcmul_(grad, lr, value=-1)
            else:
                param.add_(grad, alpha=-lr)

    def _adam(self, grads: Sequence[torch.Tensor], lr: Rate) -> None:
        beta1, beta2 = self.betas
        if self.count == 1:
            self.first = [torch.zeros_like(p) for p in self.params]
            self.second = [torch.zeros_like(p) for p in self.params]
        # torch counts steps in a float32 tensor and reads them back as a float
        step = float(torch.tensor(float(self.count), dtype=torch.float32).item())
        step_size = lr / (1 - beta1**step)
        root = (1 - beta2**step) ** 0.5
        for param, raw, avg, avg_sq in zip(self.params, grads, self.first, self.second, strict=True):
            grad = raw
            if self.weight_decay != 0:
                if self.decoupled:
                    param.mul_(1 - lr * self.weight_decay)
                else:
                    grad = raw.add(param, alpha=self.weight_decay)
            avg.lerp_(grad, 1 - beta1)
            avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (avg_sq.sqrt() / root).add_(self.eps)
            if isinstance(step_size, torch.Tensor):  # addcdiv's order: (value * avg) / denom
                param.add_(avg.mul(-step_size).div_(denom))
            else:
                param.addcdiv_(avg, denom, value=-step_size)
