"""The records of a stream plan: what a request asks of a streaming dataset (`StreamSpec`) and
what the planner answers (`StreamPlan`, its `StreamRankGroup`s and `StreamWarning`s).

A stream is an `IterableDataset` read in shards: the DataLoader takes no sampler for it, so the
splitter decides which rank and worker read which shard (app.core.split.stream.plan says how each
library does it, and plans it).
"""

from __future__ import annotations

from typing import Literal

from app.core.records.record import record

Splitter = Literal["hf_datasets", "webdataset", "rank_worker"]
EndOfEpoch = Literal["drop", "pad", "cycle", "steps"]
Branch = Literal["shards", "examples"]  # what `split_dataset_by_node` does with this shard count

SPLITTERS: tuple[Splitter, ...] = ("hf_datasets", "webdataset", "rank_worker")
END_OF_EPOCH: tuple[EndOfEpoch, ...] = ("drop", "pad", "cycle", "steps")


@record
class StreamSpec:
    """A streaming dataset as a request states it (`dataset` with kind "stream").

    Exactly one of `shard_samples` (each shard's samples, `num_shards` counts) and
    `num_samples` (shared out as `Dataset.to_iterable_dataset(num_shards)` does: contiguous, the
    first `num_samples % num_shards` shards one sample larger). `splitter` None is a stream
    nothing splits: refused, every rank would read the whole stream. `num_workers` is the
    DataLoader's per rank (0: the rank reads in its own process). `shuffle` permutes the shard
    order each epoch by `seed`, the same on every rank."""

    num_shards: int
    splitter: Splitter | None
    shard_samples: tuple[int, ...] | None = None
    num_samples: int | None = None
    num_workers: int = 0
    shuffle: bool = False
    seed: int = 0
    end_of_epoch: EndOfEpoch = "drop"


@record
class StreamWarning:
    """Something the stream does that a job should know, with where it was reported."""

    code: str  # idle_workers, examples_branch, unequal_counts, steps_without_count
    message: str  # one sentence or two, ending with its sources in parentheses
    sources: tuple[str, ...]  # "huggingface/datasets#8669", ...


@record
class ShortMicroBatch:
    """A micro-batch of fewer samples than the rank's micro_batch_size, trained in the epoch: a
    worker's last, where its stream does not fill it."""

    micro_batch: int  # its place in the rank's epoch, in the DataLoader's delivery order, from 0
    step: int  # the optimizer step of the epoch it falls in: micro_batch // accumulation
    worker: int  # the DataLoader worker that yields it
    samples: int


@record
class StreamRankGroup:
    """Consecutive data-parallel ranks [start, stop) whose figures are all equal, per rank and
    per epoch, before the end-of-epoch policy."""

    start: int
    stop: int
    shards: int  # shards the rank's readers open (the examples branch: every shard)
    samples: int  # samples the rank is handed (what it would train)
    micro_batches: int  # sum over its workers of ceil(worker's samples / micro_batch_size)
    idle_workers: int  # DataLoader workers given no shard
    micro_batch_size: int
    worker_shards: tuple[int, ...]  # per worker, in worker order (one entry with num_workers 0)
    worker_samples: tuple[int, ...]
    # Each rank's short micro-batches of the epoch that it trains (cycle and steps: of its first
    # pass; they recur every `micro_batches`), in delivery order.
    short_micro_batches: tuple[ShortMicroBatch, ...] = ()

    @property
    def count(self) -> int:
        return self.stop - self.start


@record
class StreamPlan:
    """How a stream splits over `readers` = ranks x max(1, num_workers), one epoch of it.

    `samples_read` counts what all readers read in one pass, what the examples branch reads
    and discards included. After the end-of-epoch policy every rank runs
    `micro_batches_per_epoch` micro-batches (drop: the fewest any rank has; pad, cycle and
    steps: the most), that is `optimizer_steps_per_epoch` whole steps and
    `leftover_micro_batches` more, which drop, pad and cycle skip (the next epoch starts a new
    step, as the sampler's leftover micro-steps) and steps carries into the next pass.
    `samples_trained` counts every sample trained, repeats included; `duplicated_samples` the
    repeats; `dropped_samples` the epoch's samples never trained, so that
    samples_trained - duplicated_samples + dropped_samples = num_samples."""

    splitter: Splitter
    branch: Branch | None  # hf_datasets only
    readers: int
    rank_groups: tuple[StreamRankGroup, ...]
    samples_read: int
    samples_trained: int
    duplicated_samples: int
    dropped_samples: int
    optimizer_steps_per_epoch: int
    suggested_num_shards: tuple[int, ...]
    warnings: tuple[StreamWarning, ...]
    end_of_epoch: EndOfEpoch
    epoch: int
    num_shards: int
    num_samples: int
    micro_batches_per_epoch: int
    leftover_micro_batches: int
    train_steps: int | None  # end_of_epoch "steps": the run's optimizer steps, when given
    # What each micro-batch's loss is multiplied by for the step's gradient to be the mean over
    # the step's samples, short micro-batches included (set where the request's reduction is known).
    loss_scale_formula: str | None = None
