"""The reference run: a plan's recipe trained in one process, step by step.

Every multi-step comparison holds a distributed run against this: the real-tool tests of the
exports (tests/core/test_recipe_runs.py) and the multi-step gradient check. It is written from
the plan alone, never from an export:

- each optimizer step's global batch is the plan's sampler layout: torch's own
  `DistributedSampler` indices, replica by replica, for an even plan; the core's proportional
  layout (`app.core.sampler.proportional_sampler`: micro-step k takes positions
  [k S, (k + 1) S) of the epoch's order, replica r its slice) for an uneven one; the order is
  reshuffled with seed + epoch, as `set_epoch` does;
- an epoch ends at its last whole optimizer step: the plan drops the leftover micro-batches
  (`sampler.leftover`), and the next epoch starts a new step;
- the step's loss is the plan's weighted mean over its global batch, sum over replicas r and
  their micro-batches of loss_scale_r x the micro-batch's loss / data_parallel_size, which is
  what DDP's mean of the replicas' accumulated gradients differentiates;
- the lr of step k is `app.core.recipe.lr_of` (the one schedule), the optimizer and its
  weight decay are the recipe's, stepped once per optimizer step, and the gradient is clipped
  by its global norm first when the recipe clips.

Token-normalised plans (loss_normalization token) are not modelled: their weights depend on
each step's valid tokens.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, DistributedSampler, default_collate

from app.core.plan_types import LearningRatePlan, Plan
from app.core.recipe import lr_of

# A collated micro-batch's loss, reduced as the plan's loss_reduction says (mean or sum).
LossOf = Callable[[nn.Module, Any], torch.Tensor]
# torch has no LARS or LAMB: SGD and AdamW stand in, as in every export that builds a torch optimizer.
_OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "lars": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "lamb": torch.optim.AdamW,
}


@dataclass(frozen=True)
class ReferenceStep:
    step: int  # optimizer step, from 0
    epoch: int
    lr: float  # the lr the step ran at
    loss: float  # the plan's weighted mean loss over the step's global batch, before the step
    grad_norm: float  # the global L2 norm of the step's gradient, before any clipping
    params: dict[str, torch.Tensor] | None  # after the step (keep_params)


@dataclass(frozen=True)
class ReferenceRun:
    steps: tuple[ReferenceStep, ...]
    final_params: dict[str, torch.Tensor]


# Per optimizer step: per replica, its micro-batches' dataset indices.
StepIndices = list[list[list[int]]]


def _micro_steps(plan: Plan, num_samples: int, epoch: int) -> list[list[list[int]]]:
    """One epoch: per micro-step, per replica, the indices of its micro-batch."""
    sampler, dp = plan.sampler, plan.data_parallel_size
    assert sampler is not None
    micro = [g.micro_batch_size for g in plan.replica_groups for _ in range(g.start, g.stop)]
    if plan.split == "even":
        shards = []
        for rank in range(dp):
            shard: DistributedSampler[int] = DistributedSampler(
                range(num_samples),  # type: ignore[arg-type]  # a Sized is all it reads
                num_replicas=dp,
                rank=rank,
                shuffle=sampler.shuffle,
                seed=sampler.seed,
                drop_last=sampler.drop_last,
            )
            shard.set_epoch(epoch)
            shards.append(list(shard))
        b = micro[0]
        return [
            [shard[k * b : (k + 1) * b] for shard in shards] for k in range(sampler.micro_steps_per_epoch)
        ]
    if sampler.shuffle:
        generator = torch.Generator()
        generator.manual_seed(sampler.seed + epoch)
        order: list[int] = torch.randperm(num_samples, generator=generator).tolist()
    else:
        order = list(range(num_samples))
    order = [order[p % num_samples] for p in range(sampler.total_size)]  # padded, or cut short
    offsets = [sum(micro[:r]) for r in range(dp)]
    per_step = sampler.samples_per_micro_step
    return [
        [order[k * per_step + offsets[r] : k * per_step + offsets[r] + micro[r]] for r in range(dp)]
        for k in range(sampler.micro_steps_per_epoch)
    ]


def step_indices(plan: Plan, num_samples: int, epoch: int) -> Iterator[StepIndices]:
    """The epoch's optimizer steps, each as per replica the indices of its micro-batches; the
    micro-steps after the last whole step are dropped."""
    g = plan.gradient_accumulation_steps
    micro_steps = _micro_steps(plan, num_samples, epoch)
    for first in range(0, len(micro_steps) - g + 1, g):
        chunk = micro_steps[first : first + g]
        yield [[chunk[j][r] for j in range(g)] for r in range(plan.data_parallel_size)]


def build_optimizer(lr: LearningRatePlan, params: Any) -> torch.optim.Optimizer:
    cls = _OPTIMIZERS[lr.optimizer]
    if lr.betas is not None:
        return cls(params, lr=lr.lr, betas=lr.betas, eps=lr.eps, weight_decay=lr.weight_decay)
    momentum = 0.9 if lr.momentum is None else lr.momentum
    return cls(params, lr=lr.lr, momentum=momentum, nesterov=lr.nesterov, weight_decay=lr.weight_decay)


def _checked(plan: Plan, dataset: Dataset[Any]) -> tuple[LearningRatePlan, int]:
    lr, sampler = plan.learning_rate, plan.sampler
    if lr is None or sampler is None:
        raise ValueError(
            "the reference run needs a plan with learning_rate and dataset: its recipe and sampler"
        )
    if any(g.loss_scale is None for g in plan.replica_groups):
        raise ValueError(
            "token-normalised plans are not modelled: their weights depend on each step's tokens"
        )
    num_samples = sampler.total_size - sampler.padded_samples + sampler.dropped_samples
    if len(dataset) != num_samples:  # type: ignore[arg-type]
        raise ValueError(f"the plan's dataset has {num_samples} samples, this one {len(dataset)}")  # type: ignore[arg-type]
    if sampler.optimizer_steps_per_epoch == 0:
        raise ValueError("the plan's epoch holds no whole optimizer step")
    return lr, num_samples


def reference_run(
    plan: Plan,
    model: nn.Module | Callable[[], nn.Module],
    dataset: Dataset[Any],
    loss: LossOf,
    *,
    steps: int | None = None,
    keep_params: bool = False,
    collate: Callable[[list[Any]], Any] = default_collate,
) -> ReferenceRun:
    """Train `steps` optimizer steps (default: the recipe's run) of the plan's recipe on a copy
    of `model` (or on what the factory builds), crossing epochs as the plan's sampler does."""
    lr, num_samples = _checked(plan, dataset)
    total = steps if steps is not None else lr.train_steps
    if total is None:
        raise ValueError(
            "give steps: the plan states no run length (learning_rate.train_steps or dataset.epochs)"
        )
    net = copy.deepcopy(model) if isinstance(model, nn.Module) else model()
    params = list(net.parameters())
    optimizer = build_optimizer(lr, params)
    scales = [g.loss_scale for g in plan.replica_groups for _ in range(g.start, g.stop)]
    clip = lr.max_grad_norm if lr.max_grad_norm is not None else float("inf")  # inf: unchanged
    out: list[ReferenceStep] = []
    epoch = 0
    while len(out) < total:
        for replicas in step_indices(plan, num_samples, epoch):
            optimizer.zero_grad(set_to_none=True)
            step_loss = 0.0
            for r, micro_batches in enumerate(replicas):
                weight = scales[r] / plan.data_parallel_size  # type: ignore[operator]
                for indices in micro_batches:
                    value = loss(net, collate([dataset[i] for i in indices])) * weight
                    value.backward()  # type: ignore[no-untyped-call]
                    step_loss += value.item()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
            rate = lr_of(lr, len(out))
            for group in optimizer.param_groups:
                group["lr"] = rate
            optimizer.step()
            kept = {k: v.detach().clone() for k, v in net.named_parameters()} if keep_params else None
            out.append(ReferenceStep(len(out), epoch, rate, step_loss, grad_norm, kept))
            if len(out) == total:
                break
        epoch += 1
    final = {k: v.detach().clone() for k, v in net.named_parameters()}
    return ReferenceRun(tuple(out), final)
