"""What each rank of a mesh check reads, and the control runs beside the plan's step: the
sampler's micro-batches per mesh place, the controls that change this plan's gradient, and
their gradients weighed from shared passes where the mesh allows (training.mesh_gradients)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import cycle, islice

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.utils.data import DistributedSampler

from app.contract.check_result import SkippedControl
from app.contract.mesh_spec import mesh_world
from app.contract.spec import CheckSpec
from app.core.cluster.device_mesh import ORDER
from app.worker.checks.controls import Control, split_controls
from app.worker.checks.mesh.controls import (
    PIPELINE_LOSS_NOT_SCALED,
    REPLICAS_FROM_SHARD_GROUP,
    SAMPLER_BY_GLOBAL_RANK,
    TENSOR_PEERS_DIFFERENT_DATA,
    split_mesh_controls,
)
from app.worker.checks.shards import Shards
from app.worker.training.mesh_gradients import Share, weighted_mesh_gradients
from app.worker.training.samplers import IndexDataset
from app.worker.training.stacked_passes import Pipeline
from app.worker.training.workload import Workload

Reads = list[list[int]]  # a rank's micro-batches of sample indices


class MeshRank:
    """This rank's place in the mesh and what it reads."""

    def __init__(self, spec: CheckSpec, sizes: dict[str, int], rank: int) -> None:
        place: dict[str, int] = {}
        rest = rank
        for name in reversed(ORDER):
            rest, place[name] = divmod(rest, sizes[name])
        self.spec, self.sizes, self.rank, self.place = spec, sizes, rank, place
        self.dp_rank = place["dp_replicate"] * sizes["dp_shard"] + place["dp_shard"]
        self.micro = spec.micro_batch_sizes()[self.dp_rank]
        self.scale = spec.loss_scales()[self.dp_rank]

    def sampler(self, num_replicas: int, rank: int, seed: int) -> Reads:
        """The first step's micro-batches of a DistributedSampler built this way (read around
        again if its shard is shorter than a step, as the next epoch would)."""
        spec = self.spec
        sampler: DistributedSampler[int] = DistributedSampler(
            IndexDataset(spec.num_samples),
            num_replicas=num_replicas,
            rank=rank,
            shuffle=spec.shuffle,
            seed=seed,
            drop_last=spec.drop_last,
        )
        sampler.set_epoch(0)
        g, m = spec.gradient_accumulation_steps, self.micro
        flat = list(islice(cycle(iter(sampler)), g * m))
        return [flat[k * m : (k + 1) * m] for k in range(g)]

    def reads(self, control: Control | None, plan_reads: Reads) -> Reads:
        dp, seed = self.spec.data_parallel_size, self.spec.data_seed
        if control is SAMPLER_BY_GLOBAL_RANK:
            return self.sampler(mesh_world(self.sizes), self.rank, seed)
        if control is TENSOR_PEERS_DIFFERENT_DATA:
            return self.sampler(dp, self.dp_rank, seed + self.place["tp"])
        if control is REPLICAS_FROM_SHARD_GROUP:
            return self.sampler(self.sizes["dp_shard"], self.place["dp_shard"], seed)
        return plan_reads


@dataclass(frozen=True, slots=True)
class StepRun:
    """One step to run on the mesh: the plan's (no control), or a control's mistake."""

    control: Control | None
    reads: Reads
    scale: float
    reduction: str
    scale_grads: bool = True


def control_runs(
    me: MeshRank, shards: Shards, plan_reads: Reads
) -> tuple[list[StepRun], list[SkippedControl]]:
    """Today's DDP controls (they change sample weights, whatever the mesh) where they change
    this plan's gradient, then the mesh's own."""
    spec = me.spec
    applicable, skipped = split_controls(spec, shards.every_replica, shards.epoch[: spec.global_batch_size])
    runs = [
        StepRun(
            c,
            shards.control_batches(c, me.dp_rank, plan_reads),
            float(c.loss_scale(spec, me.micro)),
            c.loss_reduction(spec),
        )
        for c in applicable
    ]
    mesh_applicable, mesh_skipped = split_mesh_controls(
        me.sizes, spec.gradient_accumulation_steps, spec.shuffle
    )
    runs += [
        StepRun(
            c,
            me.reads(c, plan_reads),
            me.scale,
            spec.loss_reduction,
            scale_grads=c is not PIPELINE_LOSS_NOT_SCALED,
        )
        for c in mesh_applicable
    ]
    return runs, skipped + mesh_skipped


def weighable(sizes: dict[str, int], stacked: bool, own_split: bool) -> bool:
    """Whether the controls can be weighings of shared passes (training.mesh_gradients): not
    under context parallel, whose shards of a sequence are not micro-batches of their own; under
    a pipeline only with the micro-batches stacked (the stages pass one forward along) and the
    built-in split into stages (each parameter on one stage)."""
    return sizes["cp"] == 1 and (sizes["pp"] == 1 or (stacked and not own_split))


# Mistakes whose reads differ between the tensor or pipeline peers of one replica: their
# micro-batches are never shared by content, so that every peer runs the same passes.
_PEERS_READ_APART = (SAMPLER_BY_GLOBAL_RANK, TENSOR_PEERS_DIFFERENT_DATA)


def weighed(
    module: nn.Module,
    mesh: DeviceMesh,
    me: MeshRank,
    workload: Workload,
    runs: list[StepRun],
    numels: dict[str, int],
    *,
    plan: tuple[Reads, torch.Tensor] | None,
    stacked: bool,
    dtype: torch.dtype,
    device: torch.device,
) -> list[torch.Tensor]:
    """Each run's whole gradient from `module` (this rank's share, no data-parallel wrapper).
    A run whose schedule does not divide by its micro-batches (scale_grads off) weighs each by
    their number. `plan`: the plan's reads and its whole gradient from the real step, where
    every rank holds it, which a run that only scales the plan's losses is a multiple of."""
    g, sizes = me.spec.gradient_accumulation_steps, me.sizes
    steps = [
        [
            (
                (i, k) if r.control in _PEERS_READ_APART else None,
                batch,
                r.scale * (1 if r.scale_grads else g),
                r.reduction,
            )
            for k, batch in enumerate(r.reads)
        ]
        for i, r in enumerate(runs)
    ]
    pipeline = Pipeline(mesh["pp"].get_group(), me.place["pp"], sizes["pp"]) if sizes["pp"] > 1 else None
    share = Share(
        module,
        workload,
        numels,
        replicas=sizes["dp_replicate"] * sizes["dp_shard"],
        tensor_rank=me.place["tp"],
        tensor_size=sizes["tp"],
        stacked=stacked,
        pipeline=pipeline,
        dtype=dtype,
        device=device,
    )
    known = (
        None if plan is None else ([(None, b, me.scale, me.spec.loss_reduction) for b in plan[0]], plan[1])
    )
    return weighted_mesh_gradients(share, steps, known)
