"""The records of a resume (app.core.resume.plan_resume): what the plan request's `resume` asks, and what
the plan's `resume` answers. Plain records, no logic."""

from __future__ import annotations

from app.core.records.record import record


@record
class ResumeSpec:
    """Where a checkpointed run goes on: after `optimizer_step` optimizer steps, or after
    `consumed_samples` samples (as Megatron counts them), on `data_parallel_size` replicas
    (None: the plan's own)."""

    optimizer_step: int | None = None
    consumed_samples: int | None = None
    data_parallel_size: int | None = None


@record
class ResumeGroup:
    """Consecutive data-parallel ranks [start, stop) of the resumed run that skip alike."""

    start: int
    stop: int
    micro_batch_size: int
    skip_micro_batches: int  # of the epoch's shard, from its start, after set_epoch(epoch)
    skip_samples: int  # the same, in samples (indices of the rank's shard)


@record
class ReaderResumeGroup:
    """Consecutive global readers [start, stop) of a rank_worker stream (reader rank x
    num_workers + worker) that start alike: each skips the first `skip_samples` of its own
    stream, that is its first `shard_in_reader` shards and `offset` samples of the next (its
    shards are the epoch's shard order[g::readers], so reader g starts in shard
    order[g + shard_in_reader x readers])."""

    start: int
    stop: int
    shard_in_reader: int  # shards of its own it has read to the end (all of them: it is done)
    offset: int  # samples of its next shard already consumed
    skip_samples: int  # of its stream, from the epoch's start (as litdata's num_samples_yielded)
    skip_micro_batches: int  # its micro-batches the DataLoader delivered before the checkpoint


@record
class StreamResume:
    """A rank_worker stream's resume: the resumed run keeps the plan's readers (their shards,
    their micro-batches), hosted by data_parallel_size ranks of `num_workers` workers each."""

    readers: int
    num_workers: int  # the resumed run's DataLoader workers per rank: readers / data_parallel_size
    reader_groups: tuple[ReaderResumeGroup, ...]


@record
class EpochTail:
    """How a plan's epoch ends: its whole optimizer steps, and where in the epoch's order
    (positions of the shuffled, padded or cut index list) its last step ends."""

    optimizer_steps: int
    last_step_end: int
    total_size: int  # the sampler's epoch, padding included or drop_last's cut made
    padded_samples: int
    dropped_samples: int


@record
class ResumePlan:
    optimizer_step: int  # steps taken before the checkpoint: the first step the run takes again
    consumed_samples: int
    epoch: int  # the uninterrupted run's epoch at that step
    step_in_epoch: int
    data_parallel_size: int  # the resumed run's
    micro_batch_size: int | None  # the resumed run's; None when its replica groups differ
    gradient_accumulation_steps: int
    skip_micro_batches: int  # each rank's, from the epoch's start (the same in every group)
    replica_groups: tuple[ResumeGroup, ...]
    lr: float | None  # the one schedule's lr at optimizer_step; None without learning_rate
    remaining_steps: int | None  # None when the run's length is unknown
    optimizer_steps_per_epoch: int  # on the resumed run's replicas (the same as _after)
    # Both runs' epochs in optimizer steps: they differ where the epoch's tail does.
    optimizer_steps_per_epoch_before: int  # the uninterrupted run's, on its replicas
    optimizer_steps_per_epoch_after: int  # the resumed run's
    same_global_batches: bool  # every later step sees the uninterrupted run's global batch
    why: str | None  # when not
    # When not: the nearest values (request fields, dotted) with which it is, each re-planned.
    suggestions: dict[str, list[int]]
    stream: StreamResume | None = None  # a stream plan's resume: where each reader starts


@record
class ScheduleResume:
    optimizer_step: int
    consumed_samples: int
    global_batch_size: int  # at that step (the ramp's)
    data_parallel_size: int
    micro_batch_size: int | None
    gradient_accumulation_steps: int  # at that step, on data_parallel_size replicas
    skip_micro_batches: int  # from the start of the data (ramp) or of the epoch (no ramp)
    lr: float | None
    remaining_steps: int
    same_global_batches: bool
    why: str | None
    epoch: int | None  # None under a ramp-up: Megatron's samplers count samples, not epochs
    step_in_epoch: int | None
