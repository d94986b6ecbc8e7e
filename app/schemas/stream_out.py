"""The plan's `stream` in the answer of POST /v1/plans (StreamOut): how a streaming dataset splits
over the data-parallel ranks and their DataLoader workers (app.core.split.stream), the mirror of
the core's StreamPlan."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.schemas.types import ResponseModel, with_examples


class ShortMicroBatchOut(ResponseModel):
    micro_batch: int = Field(
        description="Its place in each rank's epoch, in the DataLoader's delivery order, from 0."
    )
    step: int = Field(description="The optimizer step of the epoch it falls in: micro_batch // accumulation.")
    worker: int = Field(description="The DataLoader worker whose last micro-batch it is.")
    samples: int = Field(description="Its samples, fewer than micro_batch_size.")


class StreamRankGroupOut(ResponseModel):
    """Consecutive ranks [start, stop) with equal figures, per rank and per epoch, before the
    end-of-epoch policy."""

    start: int
    stop: int
    shards: int = Field(description="Shards the rank's readers open (the examples branch: every shard).")
    samples: int = Field(description="Samples the rank is handed in an epoch.")
    micro_batches: int = Field(
        description="The sum over its workers of ceil(worker's samples / micro_batch_size), short last "
        "batches included, as the DataLoader delivers them."
    )
    idle_workers: int = Field(description="DataLoader workers of the rank given no shard.")
    micro_batch_size: int
    worker_shards: list[int] = Field(description="Per worker (one entry with num_workers 0): its shards.")
    worker_samples: list[int] = Field(description="Per worker: its samples in an epoch.")
    short_micro_batches: list[ShortMicroBatchOut] = Field(
        description="Each rank's short micro-batches that the epoch trains (a worker's last; under cycle and "
        "steps those of the first pass, which recur every micro_batches): the steps whose loss scale "
        "differs (loss_scale_formula)."
    )


class StreamWarningOut(ResponseModel):
    code: Literal["idle_workers", "examples_branch", "unequal_counts", "steps_without_count"]
    message: str
    sources: list[str] = Field(description='Where it was reported: "huggingface/datasets#8669", ...')


class StreamOut(ResponseModel):
    model_config = with_examples(
        {
            "splitter": "hf_datasets",
            "branch": "shards",
            "readers": 8,
            "rank_groups": [
                {
                    "start": 0,
                    "stop": 4,
                    "shards": 4,
                    "samples": 1024,
                    "micro_batches": 256,
                    "idle_workers": 0,
                    "micro_batch_size": 4,
                    "worker_shards": [2, 2],
                    "worker_samples": [512, 512],
                    "short_micro_batches": [],
                }
            ],
            "samples_read": 4096,
            "samples_trained": 4096,
            "duplicated_samples": 0,
            "dropped_samples": 0,
            "optimizer_steps_per_epoch": 128,
            "suggested_num_shards": [],
            "warnings": [],
            "end_of_epoch": "drop",
            "epoch": 0,
            "num_shards": 16,
            "num_samples": 4096,
            "micro_batches_per_epoch": 256,
            "leftover_micro_batches": 0,
            "train_steps": None,
            "loss_scale_formula": "each micro-batch's mean loss x 4 (data_parallel_size) x its samples / 32 "
            "(every micro-batch trained is full: each step holds the global batch)",
        }
    )

    splitter: Literal["hf_datasets", "webdataset", "rank_worker"]
    branch: Literal["shards", "examples"] | None = Field(
        description="hf_datasets: what split_dataset_by_node does with this shard count (shards when "
        "num_shards % ranks == 0, else examples: every rank reads everything and keeps 1 in ranks); "
        "null for the others."
    )
    readers: int = Field(description="Ranks x max(1, num_workers).")
    rank_groups: list[StreamRankGroupOut]
    samples_read: int = Field(
        description="What all readers read in one pass, what the examples branch reads and discards included."
    )
    samples_trained: int = Field(
        description="Samples trained in an epoch after the policy, repeats included."
    )
    duplicated_samples: int = Field(description="Of them, the repeats (pad, cycle).")
    dropped_samples: int = Field(description="The epoch's samples never trained (drop).")
    optimizer_steps_per_epoch: int = Field(
        description="Whole optimizer steps an epoch after the policy: what the recipe's epochs count."
    )
    suggested_num_shards: list[int] = Field(
        description="Shard counts near the asked one that give every reader equal work (each planned); "
        "empty when the asked one does, or none can."
    )
    warnings: list[StreamWarningOut]
    end_of_epoch: Literal["drop", "pad", "cycle", "steps"]
    epoch: int = Field(description="The epoch planned (its shard order).")
    num_shards: int
    num_samples: int
    micro_batches_per_epoch: int = Field(
        description="Micro-batches every rank runs an epoch after the policy (drop: the fewest any rank "
        "has; pad, cycle, steps: the most)."
    )
    leftover_micro_batches: int = Field(
        description="Of them, those past the last whole step: skipped (drop, pad, cycle) or carried "
        "into the next pass (steps)."
    )
    train_steps: int | None = Field(description="end_of_epoch steps: the run's optimizer steps, when given.")
    loss_scale_formula: str | None = Field(
        description="What each micro-batch's loss is multiplied by so that a step's averaged gradient is the "
        "mean over the step's samples, its short micro-batches (rank_groups[].short_micro_batches) included."
    )
