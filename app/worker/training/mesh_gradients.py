"""Many steps' gradients on a mesh rank's share of the model (its pipeline stage, tensor
parallel), from shared passes and one all-reduce for them all: what a mesh check's controls
need.

A step's gradient is linear in its micro-batches' loss scales, and the data-parallel wrapper
only averages the replicas' sums; so the passes run on the module before `fully_shard` (whose
hooks would reduce every backward) and every step weighs the micro-batches by the scales it
gives them: all of them stacked in one forward and a backward per step where the stacked rows
are independent samples (stacked_passes), else one backward per distinct micro-batch. One
all-reduce over the whole mesh then averages the replicas and assembles the model: each rank
adds its shard of a parameter at the shard's place in the whole tensor (a replicated one from
the last tensor rank only, the value `full_tensor()` then the last rank's gather would
report), a pipeline stage only the parameters it holds.

A step that weighs the same micro-batches as one whose gradient every rank already holds (the
plan's, from its real step), in the same proportions and by the same factor on every replica,
is that gradient times the factor: it takes no pass (most controls that scale a loss wrongly).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from app.worker.training.assembled_gradient import placed
from app.worker.training.stacked_passes import Pipeline, Units, stacked_gradients
from app.worker.training.workload import Workload

# One micro-batch of a step: a key, its sample indices, its loss scale and its reduction. The
# tensor-parallel and pipeline peers must run the same passes in the same order: a key of None
# shares the pass with every other unit of the same samples (for reads that are the same on the
# peers), any other key only with units of that key.
Unit = tuple[Hashable | None, Sequence[int], float, str]


@dataclass(frozen=True, slots=True)
class Share:
    """A mesh rank's share of the model (no data-parallel wrapper) and how its passes run.
    `stacked` (which a pipeline needs) must be the same on every rank: decide it on the whole
    model."""

    module: nn.Module
    workload: Workload
    numels: dict[str, int]  # the whole model's parameters by name, in the gradients' order
    replicas: int
    tensor_rank: int
    tensor_size: int
    stacked: bool
    pipeline: Pipeline | None
    dtype: torch.dtype
    device: torch.device


def weighted_mesh_gradients(
    share: Share,
    steps: Sequence[Sequence[Unit]],
    known: tuple[Sequence[Unit], torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Each step's whole gradient, averaged over the data-parallel replicas, flat in the order
    of `numels`; the same on every rank.

    `known` is a step whose gradient every rank already holds (the plan's own, from the real
    wrappers): a step that weighs the same micro-batches in the same proportions on every
    replica is that gradient times one factor, and takes no pass of its own."""
    factors = _agreed_factors(steps, known[0], share.device) if known is not None and steps else {}
    computed = iter(_passes(share, [step for s, step in enumerate(steps) if s not in factors]))
    return [
        known[1] * factors[s] if known is not None and s in factors else next(computed)
        for s in range(len(steps))
    ]


def _agreed_factors(
    steps: Sequence[Sequence[Unit]], known: Sequence[Unit], device: torch.device
) -> dict[int, float]:
    """The steps whose micro-batch weights are the known step's times one factor, the same on
    every rank (one all-reduce of every step's factor, its maximum and minimum), by step."""
    mine = [_factor(step, known) for step in steps]
    bounds = torch.tensor(mine + [-f for f in mine], dtype=torch.float64, device=device)
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX)
    highest, lowest = bounds[: len(steps)].tolist(), (-bounds[len(steps) :]).tolist()
    return {
        s: hi
        for s, (hi, lo) in enumerate(zip(highest, lowest, strict=True))
        if math.isfinite(hi) and math.isclose(hi, lo, rel_tol=_SAME, abs_tol=0.0)
    }


_SAME = 1e-12  # factors computed from the same fractions in another order differ in the last bits


def _factor(step: Sequence[Unit], known: Sequence[Unit]) -> float:
    """w such that every micro-batch of `step` weighs w times its weight in `known`; inf if none."""
    factor = math.inf
    for _, _, (in_known, in_step) in _units([known, step]):
        if in_known == 0.0 or in_step == 0.0:
            if in_known != in_step:
                return math.inf
            continue
        ratio = in_step / in_known
        if math.isinf(factor):
            factor = ratio
        elif not math.isclose(ratio, factor, rel_tol=_SAME, abs_tol=0.0):
            return math.inf
    return factor


def _passes(share: Share, steps: Sequence[Sequence[Unit]]) -> list[torch.Tensor]:
    """The steps' gradients from shared passes (the module docstring) and one all-reduce."""
    if not steps:
        return []
    module, workload, dtype, device = share.module, share.workload, share.dtype, share.device
    units = _units(steps)
    held = dict(module.named_parameters())
    trainable = [p for p in held.values() if p.requires_grad]
    total = torch.zeros(len(steps), sum(share.numels.values()), dtype=dtype, device=device)

    def whole(grads: dict[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
        return torch.cat(
            [
                _placed(grads.get(held[n]), held[n], share.tensor_rank, share.tensor_size)
                .reshape(-1)
                .to(dtype)
                if n in held
                else torch.zeros(k, dtype=dtype, device=device)
                for n, k in share.numels.items()
            ]
        )

    if share.stacked:
        for s, grads in enumerate(
            stacked_gradients(module, workload, units, len(steps), trainable, share.pipeline, dtype, device)
        ):
            total[s] = whole(grads)
    else:
        if share.pipeline is not None:
            raise ValueError("a pipeline stage's passes are stacked: its peers wait on one forward")
        for indices, reduction, scales in units:
            x, y = workload.batch(indices, dtype, device)
            found = torch.autograd.grad(workload.loss(module, x, y, reduction), trainable, allow_unused=True)
            unit = whole(dict(zip(trainable, found, strict=True)))
            total.add_(torch.outer(torch.tensor(scales, dtype=dtype, device=device), unit))
    dist.all_reduce(total)
    total.div_(share.replicas)
    return list(total.unbind(0))


def _units(steps: Sequence[Sequence[Unit]]) -> Units:
    """The distinct micro-batches, each with its weight in every step."""
    weights: dict[Hashable, tuple[Sequence[int], str, list[float]]] = {}
    for s, units in enumerate(steps):
        for key, indices, scale, reduction in units:
            # A sum over samples is their mean times their number: one pass serves both.
            weight = scale * len(indices) if reduction == "sum" else scale
            passes = "mean" if reduction == "sum" else reduction
            same = (tuple(indices) if key is None else (key,), passes)
            weights.setdefault(same, (indices, passes, [0.0] * len(steps)))[2][s] += weight
    return list(weights.values())


def _placed(
    grad: torch.Tensor | None, parameter: torch.Tensor, tensor_rank: int, tensor_size: int
) -> torch.Tensor:
    """This rank's share of a parameter's whole gradient (assembled_gradient.placed): its shard
    at the shard's place, or the whole of a replicated one from the last tensor rank (zeros
    elsewhere); a plain tensor counts as replicated over the tensor ranks."""
    if grad is None:
        return torch.zeros(parameter.shape, dtype=parameter.dtype, device=parameter.device)
    if not isinstance(grad, DTensor):
        return grad if tensor_rank == tensor_size - 1 else torch.zeros_like(grad)
    whole = placed(grad)
    if whole is None:
        raise ValueError(f"a gradient placed {grad.placements} on its mesh: no place for it here")
    return whole
