"""What one data-parallel replica of a run reads, step by step, as a training job reads it: a
`DataLoader` over the plan's sampler (torch's `DistributedSampler` for an even split, the
`ProportionalSampler` for an uneven one) with `set_epoch(epoch)` at each epoch's start, the
plan's micro-batch, and the epoch cut at its last whole optimizer step (the leftover
micro-batches dropped, as the plan says).

A dataset over REAL_SAMPLER_MAX_SAMPLES is read from the plan's layout instead (`plan_steps`,
the same torch.randperm by position): each DistributedSampler builds its whole epoch as a list.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import DataLoader

from app.core.records.plan import Plan
from app.worker.training.plan_steps import dataset_size, micro_batch_sizes, run_steps
from app.worker.training.samplers import IndexDataset, plan_sampler

# As the one-step check's Shards: up to here a replica reads through its real sampler.
REAL_SAMPLER_MAX_SAMPLES = 1 << 18

# Per optimizer step: (epoch, this replica's micro-batches of dataset indices).
ReplicaStep = tuple[int, list[list[int]]]


def reads_real_sampler(plan: Plan) -> bool:
    return dataset_size(plan) <= REAL_SAMPLER_MAX_SAMPLES


def replica_steps(plan: Plan, replica: int, steps: int) -> Iterator[ReplicaStep]:
    """Replica `replica`'s first `steps` optimizer steps, crossing epochs."""
    if not reads_real_sampler(plan):
        for epoch, step in run_steps(plan, dataset_size(plan), steps):
            yield epoch, step[replica]
        return
    assert plan.sampler is not None
    sampler_plan, n = plan.sampler, dataset_size(plan)
    micro = micro_batch_sizes(plan)
    sampler = plan_sampler(
        plan.split,
        n,
        micro,
        replica,
        shuffle=sampler_plan.shuffle,
        seed=sampler_plan.seed,
        drop_last=sampler_plan.drop_last,
    )
    loader = DataLoader(IndexDataset(n), batch_size=micro[replica], sampler=sampler)
    g, per_epoch = plan.gradient_accumulation_steps, sampler_plan.optimizer_steps_per_epoch
    done, epoch = 0, 0
    while done < steps:
        sampler.set_epoch(epoch)
        batches = iter(loader)
        for _ in range(per_epoch):
            yield epoch, [next(batches).tolist() for _ in range(g)]
            done += 1
            if done == steps:
                return
        epoch += 1
