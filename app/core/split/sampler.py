"""Per-epoch sampler arithmetic: PyTorch's DistributedSampler for even splits, and the
proportional layout (every replica runs the same number of micro-steps) for uneven ones.
"""

from __future__ import annotations

import math

from app.core.records.integers import ceil_div
from app.core.records.plan import SamplerPlan
from app.core.records.plan_request import DatasetSpec


def distributed_sampler_num_samples(num_samples: int, num_replicas: int, drop_last: bool) -> int:
    """`len(DistributedSampler(...))`, written as torch writes it.

    torch divides in floating point; past 2**52 samples that can differ from exact
    integer division, and the point is to match what the user's job will really do.
    """
    if drop_last and num_samples % num_replicas != 0:
        return math.ceil((num_samples - num_replicas) / num_replicas)
    return math.ceil(num_samples / num_replicas)


def dataloader_len(num_samples: int, batch_size: int) -> int:
    """`len(DataLoader(..., batch_size=b, drop_last=False))` over `num_samples` indices."""
    return ceil_div(num_samples, batch_size)


def even_sampler(
    dataset: DatasetSpec, replicas: int, micro_batch_size: int, accumulation: int
) -> SamplerPlan:
    per_replica = distributed_sampler_num_samples(dataset.num_samples, replicas, dataset.drop_last)
    total = per_replica * replicas
    micro_steps = dataloader_len(per_replica, micro_batch_size)
    return _plan(
        dataset,
        "DistributedSampler",
        replicas,
        per_replica,
        total,
        micro_steps,
        accumulation,
        micro_batch_size * replicas,
    )


def proportional_micro_steps(num_samples: int, samples_per_micro_step: int, drop_last: bool) -> int:
    """Micro-steps in an epoch of the proportional layout: the last partial one dropped, or
    padded to whole by repeating indices from the start (as DistributedSampler pads)."""
    if drop_last:
        return num_samples // samples_per_micro_step
    return ceil_div(num_samples, samples_per_micro_step)


def proportional_sampler(
    dataset: DatasetSpec, replicas: int, samples_per_micro_step: int, accumulation: int
) -> SamplerPlan:
    """Micro-step k takes the next `samples_per_micro_step` indices of the (shuffled,
    padded) epoch; replica r reads its own slice of them. Padding, as in PyTorch,
    repeats indices from the start of the epoch."""
    micro_steps = proportional_micro_steps(dataset.num_samples, samples_per_micro_step, dataset.drop_last)
    total = micro_steps * samples_per_micro_step
    return _plan(
        dataset, "proportional", replicas, None, total, micro_steps, accumulation, samples_per_micro_step
    )


def _plan(
    dataset: DatasetSpec,
    kind: str,
    replicas: int,
    per_replica: int | None,
    total: int,
    micro_steps: int,
    accumulation: int,
    per_micro_step: int,
) -> SamplerPlan:
    n = dataset.num_samples
    steps = micro_steps // accumulation
    return SamplerPlan(
        kind=kind,
        num_replicas=replicas,
        shuffle=dataset.shuffle,
        seed=dataset.seed,
        drop_last=dataset.drop_last,
        num_samples_per_replica=per_replica,
        total_size=total,
        padded_samples=0 if dataset.drop_last else total - n,
        dropped_samples=n - total if dataset.drop_last else 0,
        micro_steps_per_epoch=micro_steps,
        optimizer_steps_per_epoch=steps,
        samples_per_micro_step=per_micro_step,
        epochs=dataset.epochs,
        total_optimizer_steps=None if dataset.epochs is None else steps * dataset.epochs,
        leftover_micro_steps=micro_steps % accumulation,
    )


def _samples(count: int) -> str:
    return f"{count} sample{'s' if count != 1 else ''} per epoch {'is' if count == 1 else 'are'}"


def sampler_warnings(
    sampler: SamplerPlan, dataset: DatasetSpec, micro_batch_size: int | None, accumulation: int
) -> list[str]:
    out = []
    who = "DistributedSampler" if sampler.kind == "DistributedSampler" else "the proportional sampler"
    if sampler.padded_samples:
        out.append(
            f"{_samples(sampler.padded_samples)} seen twice: {who} pads "
            f"{dataset.num_samples} to {sampler.total_size}"
        )
    if sampler.dropped_samples:
        out.append(
            f"{_samples(sampler.dropped_samples)} never seen: {who} with drop_last "
            f"keeps {sampler.total_size} of {dataset.num_samples}"
        )
    if sampler.micro_steps_per_epoch == 0:
        out.append(
            f"the dataset of {dataset.num_samples} samples is too small for one "
            f"micro-step of {sampler.samples_per_micro_step} samples: an epoch is empty"
        )
    if (
        sampler.num_samples_per_replica is not None
        and micro_batch_size
        and sampler.num_samples_per_replica % micro_batch_size
    ):
        last = sampler.num_samples_per_replica % micro_batch_size
        out.append(
            f"the last micro-batch of each epoch holds {last} of {micro_batch_size} "
            f"samples per replica, so its samples weigh more in that step's gradient"
        )
    leftover = sampler.micro_steps_per_epoch % accumulation
    if leftover:
        out.append(
            f"an epoch ends mid-accumulation: its last {leftover} of "
            f"{sampler.micro_steps_per_epoch} micro-steps do not complete an optimizer step "
            f"(optimizer_steps_per_epoch = {sampler.optimizer_steps_per_epoch} counts whole "
            f"steps): the plan drops them, and every export skips them"
        )
    return out
