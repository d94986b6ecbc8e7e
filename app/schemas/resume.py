"""The plan request's `resume` and the plan's `resume` (app.core.resume.plan_resume), as HTTP validates and
documents them."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from app.schemas.types import RequestModel, ResponseModel, plan_limit, with_examples


class ResumeIn(RequestModel):
    """Where a checkpointed run goes on: give optimizer_step or consumed_samples."""

    model_config = with_examples({"optimizer_step": 1200, "data_parallel_size": 8})

    optimizer_step: Annotated[int, plan_limit("resume.optimizer_step")] | None = Field(
        None, description="Optimizer steps taken before the checkpoint: the run goes on with this step."
    )
    consumed_samples: Annotated[int, plan_limit("resume.consumed_samples")] | None = Field(
        None,
        description="Samples consumed before the checkpoint, as Megatron counts them (a whole number of "
        "global batches; with a ramp-up, through POST /v1/plans/schedule).",
    )
    data_parallel_size: Annotated[int, plan_limit("resume.data_parallel_size")] | None = Field(
        None,
        description="The data-parallel size the run goes on with (default: the plan's). It must divide the "
        "global batch, which a resume keeps; each replica takes the largest micro-batch that divides its "
        "share within max_micro_batch_size (else the plan's micro-batch), and accumulates the rest.",
    )


class ResumeGroupOut(ResponseModel):
    start: int = Field(description="First data-parallel rank of the resumed run (inclusive).")
    stop: int = Field(description="Last data-parallel rank (exclusive).")
    micro_batch_size: int
    skip_micro_batches: int = Field(
        description="Micro-batches each of these ranks skips from the epoch's start."
    )
    skip_samples: int = Field(description="The same in samples: indices of the rank's shard.")


class ReaderResumeGroupOut(ResponseModel):
    start: int = Field(
        description="First global reader (rank x num_workers + worker) of the group (inclusive)."
    )
    stop: int = Field(description="Last global reader (exclusive).")
    shard_in_reader: int = Field(
        description="Shards of the reader's own list (the epoch's shard order[g::readers] for reader g) read "
        "to the end before the checkpoint: it starts in shard order[g + shard_in_reader x readers] (shard "
        "g + shard_in_reader x readers without shuffle); all of them when the reader is done."
    )
    offset: int = Field(description="Samples of that shard already consumed: the reader starts at this row.")
    skip_samples: int = Field(
        description="Samples of the reader's stream consumed, from the epoch's start (litdata's "
        "num_samples_yielded of the reader)."
    )
    skip_micro_batches: int = Field(description="The reader's micro-batches delivered before the checkpoint.")


class StreamResumeOut(ResponseModel):
    readers: int = Field(description="The plan's readers (ranks x workers), which the resumed run keeps.")
    num_workers: int = Field(
        description="The resumed run's DataLoader workers per rank: readers / data_parallel_size (1 reads "
        "as 0 does: the rank itself)."
    )
    reader_groups: list[ReaderResumeGroupOut] = Field(
        description="Where each reader starts again, consecutive readers that start alike merged."
    )


class ResumeOut(ResponseModel):
    model_config = with_examples(
        {
            "optimizer_step": 5,
            "consumed_samples": 60,
            "epoch": 0,
            "step_in_epoch": 5,
            "data_parallel_size": 2,
            "micro_batch_size": 3,
            "gradient_accumulation_steps": 2,
            "skip_micro_batches": 10,
            "replica_groups": [
                {"start": 0, "stop": 2, "micro_batch_size": 3, "skip_micro_batches": 10, "skip_samples": 30}
            ],
            "lr": 0.1,
            "remaining_steps": 11,
            "optimizer_steps_per_epoch": 8,
            "optimizer_steps_per_epoch_before": 8,
            "optimizer_steps_per_epoch_after": 8,
            "same_global_batches": True,
            "why": None,
            "suggestions": {},
        }
    )

    optimizer_step: int = Field(
        description="The step the run goes on with (steps taken before the checkpoint)."
    )
    consumed_samples: int = Field(description="optimizer_step x global_batch_size.")
    epoch: int = Field(
        description="The uninterrupted run's epoch at that step: call sampler.set_epoch(epoch)."
    )
    step_in_epoch: int = Field(description="Optimizer steps of that epoch already taken.")
    data_parallel_size: int = Field(description="The resumed run's replicas.")
    micro_batch_size: int | None = Field(
        description="The resumed run's; null when its replica groups differ."
    )
    gradient_accumulation_steps: int = Field(
        description="The resumed run's: global batch / (micro x replicas)."
    )
    skip_micro_batches: int = Field(
        description="Micro-batches each rank skips from the epoch's start (step_in_epoch x accumulation); "
        "replica_groups has each group's, and its samples."
    )
    replica_groups: list[ResumeGroupOut]
    lr: float | None = Field(
        description="The schedule's lr at optimizer_step (not step 0); null without learning_rate."
    )
    remaining_steps: int | None = Field(
        description="Optimizer steps left; null when the run's length is unknown."
    )
    optimizer_steps_per_epoch: int = Field(
        description="On the resumed run's replicas: optimizer_steps_per_epoch_after, kept for the clients "
        "that read it."
    )
    optimizer_steps_per_epoch_before: int = Field(
        description="The uninterrupted run's epoch in optimizer steps, on the plan's own replicas."
    )
    optimizer_steps_per_epoch_after: int = Field(
        description="The resumed run's epoch in optimizer steps, on data_parallel_size replicas: it differs "
        "from _before where the epoch's tail (padding, drop_last, a last short step) depends on the replicas."
    )
    same_global_batches: bool = Field(
        description="Every later optimizer step sees, as a set, the global batch the uninterrupted run would "
        "have seen (the epoch's tail, padding and drop_last depend on the replicas: see why)."
    )
    why: str | None = Field(
        description="When same_global_batches is false: the step whose samples differ, and why."
    )
    suggestions: dict[str, list[int]] = Field(
        description="When same_global_batches is false: the nearest values (request fields) with which it is "
        "true, each planned before it is given."
    )
    stream: StreamResumeOut | None = Field(
        None,
        description="A rank_worker stream's resume (docs/streams.md): the readers it keeps and where each "
        "starts again; null for a map dataset.",
    )
