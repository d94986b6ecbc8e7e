"""The reference run: a plan's recipe trained in one process, step by step.

Every multi-step comparison holds a distributed run against this: the real-tool tests of the
exports (tests/core/test_recipe_runs.py) and the multi-step gradient check (checks/run/check.py,
checks/run/mesh.py). It is written from the plan alone, never from an export:

- each optimizer step's global batch is the plan's sampler layout (`plan_steps`: the indices
  torch's DistributedSampler gives for an even plan, the proportional layout for an uneven
  one), reshuffled with seed + epoch as `set_epoch` does;
- an epoch ends at its last whole optimizer step: the plan drops the leftover micro-batches
  (`sampler.leftover`), and the next epoch starts a new step;
- the step's loss is the plan's weighted mean over its global batch, sum over replicas r and
  their micro-batches of loss_scale_r x the micro-batch's loss / data_parallel_size, which is
  what DDP's mean of the replicas' accumulated gradients differentiates; under
  loss_normalization token, each micro-batch's summed token loss over the step's valid tokens
  N (every micro-batch of every replica), the weight torchtitan's global token count gives;
- the lr of step k is `app.core.learning_rate.recipe.lr_of` (the one schedule), the optimizer and its
  weight decay are the recipe's, stepped once per optimizer step, and the gradient is clipped
  by its global norm first when the recipe clips.

A `RunVariant` departs from the plan in one way, as a known mistake does: the multi-step
check's run-level controls are these runs (checks/run/controls.py says which mistake each is).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from app.core.learning_rate.recipe_summary import lr_of
from app.core.records.plan import LearningRatePlan, Plan
from app.worker.training.plan_steps import StepIndices, dataset_size, run_steps

__all__ = [
    "ReferenceRun",
    "ReferenceStep",
    "ReferenceTrainer",
    "RunVariant",
    "build_optimizer",
    "reference_run",
]

# A collated micro-batch's loss, reduced as the plan's loss_reduction says (mean or sum).
LossOf = Callable[[nn.Module, Any], torch.Tensor]
# A micro-batch's loss by its dataset indices: the plan's reduction, or the valid tokens' sum
# under loss_normalization token.
MicroLoss = Callable[[nn.Module, list[int]], torch.Tensor]
# torch has no LARS or LAMB: SGD and AdamW stand in, as in every export that builds a torch optimizer.
_OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "lars": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "lamb": torch.optim.AdamW,
}
# torch's clip_grad_norm_ multiplies by max_norm / (norm + 1e-6), clamped at 1.
_CLIP_EPS = 1e-6


@dataclass(frozen=True)
class ReferenceStep:
    step: int  # optimizer step, from 0
    epoch: int
    lr: float  # the lr the step ran at
    loss: float  # the plan's weighted mean loss over the step's global batch, before the step
    grad_norm: float  # the global L2 norm of the step's gradient, before any clipping
    params: dict[str, torch.Tensor] | None  # after the step (keep_params)
    clipped: bool = False  # a clip coefficient below 1 changed this step's gradient
    valid_tokens: int | None = None  # the step's valid tokens, under loss_normalization token


@dataclass(frozen=True)
class ReferenceRun:
    steps: tuple[ReferenceStep, ...]
    final_params: dict[str, torch.Tensor]


@dataclass(frozen=True)
class RunVariant:
    """A run that departs from the plan as one mistake does (the default is the plan's run).

    `scheduler_step(k)`: the scheduler step whose lr optimizer step k runs at (k when the
    scheduler steps once per optimizer step); `sampler_epoch(e)`: the sampler epoch whose order
    training epoch e reads (e when `set_epoch(e)` is called); `clip_per_replica`: each replica
    clips its own accumulated gradient to max_grad_norm, and the clipped gradients are averaged
    (in place of clipping the average)."""

    scheduler_step: Callable[[int], int] | None = None
    sampler_epoch: Callable[[int], int] | None = None
    clip_per_replica: bool = False


def build_optimizer(lr: LearningRatePlan, params: Any) -> torch.optim.Optimizer:
    cls = _OPTIMIZERS[lr.optimizer]
    if lr.betas is not None:
        return cls(params, lr=lr.lr, betas=lr.betas, eps=lr.eps, weight_decay=lr.weight_decay)
    momentum = 0.9 if lr.momentum is None else lr.momentum
    return cls(params, lr=lr.lr, momentum=momentum, nesterov=lr.nesterov, weight_decay=lr.weight_decay)


def clip_bites(norm: float, max_norm: float | None) -> bool:
    """Whether clip_grad_norm_ at `max_norm` changes a gradient of this norm."""
    return max_norm is not None and norm + _CLIP_EPS > max_norm


def _recipe(plan: Plan) -> LearningRatePlan:
    if plan.learning_rate is None or plan.sampler is None:
        raise ValueError(
            "the reference run needs a plan with learning_rate and dataset: its recipe and sampler"
        )
    return plan.learning_rate


def _backward(loss: torch.Tensor) -> None:
    loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated


class ReferenceTrainer:
    """The reference run (or a variant's), one optimizer step at a time: `steps(n)` yields each
    step once taken, `net` then holds the parameters after it."""

    def __init__(
        self,
        plan: Plan,
        model: nn.Module | Callable[[], nn.Module],
        micro_loss: MicroLoss,
        *,
        variant: RunVariant | None = None,
        valid_tokens: Callable[[list[int]], int] | None = None,
        sample_sum: MicroLoss | None = None,
    ) -> None:
        """`sample_sum(net, indices)`, for a model whose loss is a sum over samples (tokens,
        under loss_normalization token) with nothing shared between them (no batch norm): that
        sum over any batch. A step is then one forward and backward per distinct per-sample
        weight, the same gradient as micro-batch by micro-batch."""
        self.plan, self.lr = plan, _recipe(plan)
        self.by_tokens = any(g.loss_scale is None for g in plan.replica_groups)
        if self.by_tokens and valid_tokens is None:
            raise ValueError(
                "a token-normalised plan weighs each step by its valid tokens: give valid_tokens"
            )
        self.micro_loss, self.valid_tokens, self.sample_sum = micro_loss, valid_tokens, sample_sum
        self.variant = variant or RunVariant()
        self.net = copy.deepcopy(model) if isinstance(model, nn.Module) else model()
        self.params = list(self.net.parameters())
        self.optimizer = build_optimizer(self.lr, self.params)
        dp = plan.data_parallel_size
        self.scales = [
            (g.loss_scale or 0.0) / dp for g in plan.replica_groups for _ in range(g.start, g.stop)
        ]

    def steps(self, total: int) -> Iterator[ReferenceStep]:
        sampler_epoch = self.variant.sampler_epoch
        for k, (epoch, replicas) in enumerate(
            run_steps(self.plan, dataset_size(self.plan), total, sampler_epoch)
        ):
            yield self._step(k, epoch, replicas)

    def flat_params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def _weights(self, replicas: StepIndices) -> tuple[list[float], int | None]:
        """Each replica's weight on its micro-batches' losses in the step's mean."""
        if not self.by_tokens:
            return self.scales, None
        assert self.valid_tokens is not None
        valid = sum(self.valid_tokens(b) for batches in replicas for b in batches)
        return [1.0 / valid if valid else 0.0] * len(replicas), valid

    def _accumulate(self, replicas: StepIndices, weights: list[float], factor: float = 1.0) -> float:
        """Backward of the step's weighted loss (times `factor`); returns the loss."""
        if self.sample_sum is not None:
            return self._accumulate_merged(replicas, weights, factor)
        total = 0.0
        for r, batches in enumerate(replicas):
            for indices in batches:
                value = self.micro_loss(self.net, indices) * (weights[r] * factor)
                _backward(value)
                total += value.item() / factor
        return total

    def _accumulate_merged(self, replicas: StepIndices, weights: list[float], factor: float) -> float:
        assert self.sample_sum is not None
        per_mean = self.plan.loss_reduction == "mean" and not self.by_tokens
        merged: dict[float, list[int]] = {}
        for r, batches in enumerate(replicas):
            for indices in batches:
                weight = weights[r] / len(indices) if per_mean else weights[r]
                merged.setdefault(weight, []).extend(indices)
        total = 0.0
        for weight, indices in merged.items():
            value = self.sample_sum(self.net, indices) * (weight * factor)
            _backward(value)
            total += value.item() / factor
        return total

    def _step(self, k: int, epoch: int, replicas: StepIndices) -> ReferenceStep:
        clip, variant = self.lr.max_grad_norm, self.variant
        weights, valid = self._weights(replicas)
        self.optimizer.zero_grad(set_to_none=True)
        if variant.clip_per_replica and clip is not None:
            loss, clipped = self._clipped_per_replica(replicas, weights, clip)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, float("inf")))
        else:
            loss = self._accumulate(replicas, weights)
            # inf: the norm is measured and the gradient left as it is.
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, clip or float("inf")))
            clipped = clip_bites(grad_norm, clip)
        rate = lr_of(self.lr, variant.scheduler_step(k) if variant.scheduler_step else k)
        for group in self.optimizer.param_groups:
            group["lr"] = rate
        self.optimizer.step()
        return ReferenceStep(k, epoch, rate, loss, grad_norm, None, clipped, valid)

    def _clipped_per_replica(
        self, replicas: StepIndices, weights: list[float], clip: float
    ) -> tuple[float, bool]:
        """Each replica's own gradient (its loss scale without DDP's division by the replicas)
        clipped to `clip`, then the mean of the clipped gradients, as DDP would average them."""
        dp = len(replicas)
        average = [torch.zeros_like(p) for p in self.params]
        loss, clipped = 0.0, False
        for r in range(dp):
            self.optimizer.zero_grad(set_to_none=True)
            one: StepIndices = [[] for _ in range(dp)]
            one[r] = replicas[r]
            loss += self._accumulate(one, weights, factor=dp)
            norm = float(torch.nn.utils.clip_grad_norm_(self.params, clip))
            clipped = clipped or clip_bites(norm, clip)
            for total, p in zip(average, self.params, strict=True):
                if p.grad is not None:
                    total.add_(p.grad, alpha=1.0 / dp)
        for total, p in zip(average, self.params, strict=True):
            p.grad = total
        return loss, clipped


def reference_run(
    plan: Plan,
    model: nn.Module | Callable[[], nn.Module],
    dataset: Dataset[Any],
    loss: LossOf,
    *,
    steps: int | None = None,
    keep_params: bool = False,
    collate: Callable[[list[Any]], Any] = default_collate,
    variant: RunVariant | None = None,
    valid_tokens: Callable[[list[int]], int] | None = None,
) -> ReferenceRun:
    """Train `steps` optimizer steps (default: the recipe's run) of the plan's recipe on a copy
    of `model` (or on what the factory builds), crossing epochs as the plan's sampler does.
    Under loss_normalization token, `loss` sums the micro-batch's token losses and
    `valid_tokens(indices)` counts its valid tokens."""
    lr = _recipe(plan)
    expected = dataset_size(plan)
    if len(dataset) != expected:  # type: ignore[arg-type]
        raise ValueError(f"the plan's dataset has {expected} samples, this one {len(dataset)}")  # type: ignore[arg-type]
    total = steps if steps is not None else lr.train_steps
    if total is None:
        raise ValueError(
            "give steps: the plan states no run length (learning_rate.train_steps or dataset.epochs)"
        )

    def micro_loss(net: nn.Module, indices: list[int]) -> torch.Tensor:
        return loss(net, collate([dataset[i] for i in indices]))

    trainer = ReferenceTrainer(plan, model, micro_loss, variant=variant, valid_tokens=valid_tokens)
    out = []
    for step in trainer.steps(total):
        kept = {k: v.detach().clone() for k, v in trainer.net.named_parameters()} if keep_params else None
        out.append(replace(step, params=kept))
    final = {k: v.detach().clone() for k, v in trainer.net.named_parameters()}
    return ReferenceRun(tuple(out), final)
