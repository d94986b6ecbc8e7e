"""What the resume check (check.py) is built from: where each resumed replica reads, the
process groups the resumed ranks form, and the resume controls.

A resumed replica reads as a training job restarted from a checkpoint reads: torch's
`DistributedSampler` for the new number of replicas, `set_epoch(epoch)`, its first `skip`
indices skipped (Accelerate's `skip_first_batches`, a restored loader position), the rest in
micro-batches, an epoch cut at its last whole optimizer step as the plan cuts it. Where each
replica resumes is the core's (app.core.resume.plan_resume: `replica_groups[].skip_samples`).

The controls are resumes gone wrong, each trained on rank 0 from the reference run's own state
at the checkpoint (a copy of its trainer: the steps before it are the reference's). Each runs
where it changes the run (the samples a step reads, their weights or its lr differ from the
right resume's on some step); else it is skipped with the reason.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.utils.data import DistributedSampler

from app.core.records.plan import Plan
from app.worker.training.mesh_models import mesh_names
from app.worker.training.plan_steps import StepIndices, dataset_size
from app.worker.training.samplers import IndexDataset

ReplicaStep = tuple[int, list[list[int]]]  # (epoch, this replica's micro-batches of indices)


@dataclass(frozen=True, slots=True)
class ResumedReplicas:
    """How the resumed replicas read: how many, their micro-batch and accumulation, where the
    resumed epoch starts in each one's shard, and each one's weight on a micro-batch's loss."""

    replicas: int
    micro: int
    accumulation: int
    skip: tuple[int, ...]  # per replica, indices of its shard skipped in the resumed epoch
    scales: tuple[float, ...]  # per replica, loss_scale / replicas (what DDP's mean makes of it)


def layout_of(plan: Plan, skip: Callable[[int], int], *, keep: Plan | None = None) -> ResumedReplicas:
    """`plan`'s replicas reading from `skip(replica)`; `keep`: with that plan's micro-batch,
    accumulation and loss scale instead (the global batch changes)."""
    own = keep or plan
    dp, group = plan.data_parallel_size, own.replica_groups[0]
    scale = (group.loss_scale or 0.0) / dp
    return ResumedReplicas(
        dp,
        group.micro_batch_size,
        own.gradient_accumulation_steps,
        tuple(map(skip, range(dp))),
        (scale,) * dp,
    )


def resumed_feed(plan: Plan, layout: ResumedReplicas, replica: int, epoch: int) -> Iterator[ReplicaStep]:
    """Replica `replica`'s optimizer steps from the resumed epoch `epoch` on, crossing epochs."""
    assert plan.sampler is not None
    sampler_plan, skip = plan.sampler, layout.skip[replica]
    sampler: DistributedSampler[int] = DistributedSampler(
        IndexDataset(dataset_size(plan)),
        num_replicas=layout.replicas,
        rank=replica,
        shuffle=sampler_plan.shuffle,
        seed=sampler_plan.seed,
        drop_last=sampler_plan.drop_last,
    )
    m, g = layout.micro, layout.accumulation
    while True:
        sampler.set_epoch(epoch)
        shard = list(sampler)[skip:]
        batches = [shard[i : i + m] for i in range(0, len(shard), m)]
        for step in range(len(batches) // g):
            yield epoch, batches[step * g : (step + 1) * g]
        epoch, skip = epoch + 1, 0


def layout_steps(
    plan: Plan, layout: ResumedReplicas, epoch: int, steps: int
) -> list[tuple[int, StepIndices]]:
    """Every replica's steps, `steps` of them: what rank 0's single-process runs train on."""
    feeds = [resumed_feed(plan, layout, r, epoch) for r in range(layout.replicas)]
    out: list[tuple[int, StepIndices]] = []
    for _ in range(steps):
        reads = [next(feed) for feed in feeds]
        out.append((reads[0][0], [batches for _, batches in reads]))
    return out


# The process groups and meshes of the resumed ranks, built once per default group (a warm
# rank keeps its group between checks, and every rank must create a group at the same time).
_groups: dict[tuple[object, int], dist.ProcessGroup] = {}
_meshes: dict[tuple[object, str, tuple[int, ...], tuple[str, ...]], DeviceMesh] = {}


def _current() -> object:
    """The default group, the groups built on an earlier one forgotten (a re-formed pool)."""
    world = dist.group.WORLD
    for kept in (_groups, _meshes):
        _forget(kept, world)
    return world


def _forget(kept: dict[Any, Any], world: object) -> None:
    for key in [k for k in kept if k[0] is not world]:
        del kept[key]


def first_ranks(n: int) -> dist.ProcessGroup | None:
    """The group of ranks 0..n-1 (None: the whole default group); every rank calls it."""
    if n == dist.get_world_size():
        return None
    key = (_current(), n)
    if key not in _groups:
        _groups[key] = dist.new_group(list(range(n)))
    return _groups[key]


def sub_mesh(sizes: dict[str, int], device: torch.device) -> DeviceMesh:
    """The mesh of `sizes` on the first ranks; the others take part in building it and hold no
    coordinate in it (DeviceMesh's non-participating ranks)."""
    names = tuple(mesh_names(sizes))
    shape = tuple(sizes[n] for n in names)
    key = (_current(), device.type, shape, names)
    if key not in _meshes:
        ranks = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
        _meshes[key] = DeviceMesh(device.type, ranks, mesh_dim_names=names)
    return _meshes[key]


def summed(values: list[float], device: torch.device) -> list[float]:
    """Summed over the default group: every rank takes part, an idle one with zeros."""
    summed = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(summed)
    return [float(v) for v in summed.tolist()]


def checkpoint_of(state: dict[str, Any] | None, group: dist.ProcessGroup | None) -> dict[str, Any]:
    """Rank 0's checkpoint, as every rank of `group` reads it from the one file."""
    box: list[bytes | None] = [None]
    if state is not None:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        box[0] = buffer.getvalue()
    dist.broadcast_object_list(box, src=0, group=group)
    assert box[0] is not None
    loaded: dict[str, Any] = torch.load(io.BytesIO(box[0]), weights_only=True)
    return loaded
