"""The optimizer steps of a plan's run as its sampler lays them out: per step, per replica, the
dataset indices of that replica's micro-batches. Each epoch is reshuffled with seed + epoch
(what `sampler.set_epoch(epoch)` does), and the micro-steps after an epoch's last whole
optimizer step are dropped (the plan's `sampler.leftover`): the next epoch starts a new step.

Read by position from `samplers.EpochOrder` (the `torch.randperm` DistributedSampler draws,
padded or cut to the sampler's total size), a step at a time, so a run of a few steps over a
large dataset reads only those steps. tests/worker/training/test_reference_run.py holds the layout
against a DataLoader over torch's DistributedSampler and over the ProportionalSampler:

- even: replica r's shard is positions r, r + dp, r + 2 dp, ... of the epoch
  (`indices[rank:total_size:num_replicas]`), its micro-batch k the shard's positions
  [k b, (k + 1) b), the last one short when the shard is not a multiple of b;
- proportional: micro-step k covers positions [k S, (k + 1) S), replica r its own slice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import accumulate

from app.core.records.plan import Plan, SamplerPlan
from app.worker.training.samplers import EpochOrder

# Per optimizer step: per replica, its micro-batches' dataset indices.
StepIndices = list[list[list[int]]]


def micro_batch_sizes(plan: Plan) -> list[int]:
    return [g.micro_batch_size for g in plan.replica_groups for _ in range(g.start, g.stop)]


def _sampler(plan: Plan) -> SamplerPlan:
    if plan.sampler is None:
        raise ValueError("the plan has no dataset, so no sampler to lay its steps out")
    return plan.sampler


def step_indices(plan: Plan, num_samples: int, epoch: int) -> Iterator[StepIndices]:
    """The epoch's whole optimizer steps, read from the order of sampler epoch `epoch`."""
    sampler, dp, g = _sampler(plan), plan.data_parallel_size, plan.gradient_accumulation_steps
    order = EpochOrder(num_samples, sampler.total_size, sampler.shuffle, sampler.seed, epoch)
    micro = micro_batch_sizes(plan)
    offsets = [0, *accumulate(micro)]
    shard = sampler.total_size // dp

    def positions(replica: int, k: int) -> range:
        if plan.split == "even":
            start, stop = k * micro[0], min((k + 1) * micro[0], shard)
            return range(replica + dp * start, replica + dp * stop, dp)
        first = k * sampler.samples_per_micro_step + offsets[replica]
        return range(first, first + micro[replica])

    for step in range(sampler.optimizer_steps_per_epoch):
        yield [[order.read(positions(r, step * g + j)) for j in range(g)] for r in range(dp)]


def run_steps(
    plan: Plan, num_samples: int, steps: int, sampler_epoch: Callable[[int], int] | None = None
) -> Iterator[tuple[int, StepIndices]]:
    """(epoch, step) for the run's first `steps` optimizer steps, crossing epochs. The order of
    training epoch e is the sampler's epoch `sampler_epoch(e)` (default e: set_epoch called)."""
    if _sampler(plan).optimizer_steps_per_epoch == 0:
        raise ValueError("the plan's epoch holds no whole optimizer step")
    done, epoch = 0, 0
    while done < steps:
        for step in step_indices(plan, num_samples, sampler_epoch(epoch) if sampler_epoch else epoch):
            yield epoch, step
            done += 1
            if done == steps:
                return
        epoch += 1


def dataset_size(plan: Plan) -> int:
    """The samples in the plan's dataset, from its sampler's arithmetic."""
    sampler = _sampler(plan)
    return sampler.total_size - sampler.padded_samples + sampler.dropped_samples
