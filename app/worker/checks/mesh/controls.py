"""The mistakes people make under a device mesh, run beside a mesh check where they change
the gradient, skipped with the reason where they cannot.

Each names how a rank reads its data (which DistributedSampler it builds) or how the pipeline
schedule scales its loss; `check` runs them on the same mesh as the plan.
"""

from __future__ import annotations

from app.contract.check_result import SkippedControl
from app.worker.checks.controls import Control, partition

SAMPLER_BY_GLOBAL_RANK = Control(
    "sampler_by_global_rank",
    "DistributedSampler(num_replicas=world_size, rank=global rank): data sharded over every "
    "process instead of the data-parallel group",
)
TENSOR_PEERS_DIFFERENT_DATA = Control(
    "tensor_peers_see_different_data",
    "each tensor-parallel peer shuffles with its own seed (seed + tensor rank), so peers of one "
    "replica feed different samples",
)
REPLICAS_FROM_SHARD_GROUP = Control(
    "replicas_from_shard_group",
    "HSDP with num_replicas = the shard group's size and rank = the shard rank: replicas in "
    "different replicate groups read the same samples",
)
PIPELINE_LOSS_NOT_SCALED = Control(
    "pipeline_loss_not_scaled",
    "the pipeline schedule sums its micro-batch losses without dividing by their number (scale_grads=False)",
)

MESH_CONTROLS = (
    SAMPLER_BY_GLOBAL_RANK,
    TENSOR_PEERS_DIFFERENT_DATA,
    REPLICAS_FROM_SHARD_GROUP,
    PIPELINE_LOSS_NOT_SCALED,
)


def _harmless_because(
    control: Control, sizes: dict[str, int], accumulation: int, shuffle: bool
) -> str | None:
    model_parallel = sizes["pp"] * sizes["cp"] * sizes["tp"]
    if control is SAMPLER_BY_GLOBAL_RANK and model_parallel == 1:
        return "no tensor, pipeline or context dimension: the global rank is the data-parallel rank"
    if control is TENSOR_PEERS_DIFFERENT_DATA:
        if sizes["tp"] == 1:
            return "tensor 1: there are no tensor-parallel peers"
        if not shuffle:
            return "the dataset is not shuffled, so a seed per peer leaves the order as it is"
    if control is REPLICAS_FROM_SHARD_GROUP and 1 in (sizes["dp_shard"], sizes["dp_replicate"]):
        return "not HSDP: the shard group is the whole data-parallel group, or there is none"
    if control is PIPELINE_LOSS_NOT_SCALED:
        if sizes["pp"] == 1:
            return "pipeline 1: no schedule runs micro-batches"
        if accumulation == 1:
            return "one micro-batch per step: there is nothing to divide by"
    return None


def split_mesh_controls(
    sizes: dict[str, int], accumulation: int, shuffle: bool
) -> tuple[list[Control], list[SkippedControl]]:
    return partition(MESH_CONTROLS, lambda c: _harmless_because(c, sizes, accumulation, shuffle))
