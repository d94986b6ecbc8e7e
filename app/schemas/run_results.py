"""HTTP models of what a check of several optimizer steps adds to its result: the run's
trajectory against the reference run, how its epochs ended, and each run-level control's run
(app.contract.run_result writes them)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class TrajectoryStepOut(BaseModel):
    step: int = Field(description="Optimizer step, from 0.")
    epoch: int = Field(description="The epoch it read from (its sampler's set_epoch).")
    lr: float = Field(description="The learning rate it stepped with (the recipe's lr_of the step).")
    loss: float = Field(
        description="The run's loss over the step's global batch, weighted as the plan says "
        "(all-reduced over the replicas), before the step."
    )
    reference_loss: float = Field(description="The single-process reference run's, on its own weights.")
    params_rel_l2: float = Field(
        description="Relative L2 distance of the run's parameters after the step from the reference's."
    )
    valid_tokens: int | None = Field(
        description="The step's valid tokens over every micro-batch and replica (loss_normalization "
        "token), all-reduced as torchtitan counts them; null for sample plans."
    )
    within_tolerance: bool = Field(
        description="params_rel_l2, and the loss's relative difference, within run_tolerance."
    )


class ControlStepOut(BaseModel):
    step: int
    lr: float = Field(description="The lr the mistake stepped with.")
    loss: float
    params_rel_l2: float = Field(description="Its parameters after the step against the reference's.")


class EpochEndOut(BaseModel):
    """How the run's epochs ended: what it did with an epoch's leftover micro-batches."""

    optimizer_steps_per_epoch: int
    epochs_run: int = Field(description="Epochs the run's steps touched.")
    leftover: Literal["dropped"] = Field(
        description="The micro-batches after an epoch's last whole optimizer step (the plan's "
        "sampler.leftover): dropped, and the next epoch starts a new step."
    )
    leftover_micro_steps: int = Field(description="Micro-steps dropped at the end of each epoch.")
    short_micro_batch_samples: int | None = Field(
        description="Samples in each replica's last micro-batch of an epoch when it is short (an even "
        "split whose shard is not a multiple of the micro-batch) and a step reads it: weighted as the "
        "plan says, its mean times the replica's loss scale. null: no step reads a short one.",
        examples=[2],
    )


class ResumedGroupOut(BaseModel):
    start: int = Field(description="The first data-parallel rank of the resumed run in the group.")
    stop: int = Field(description="One past its last.")
    micro_batch_size: int
    skip_micro_batches: int = Field(
        description="Micro-batches each of its ranks skipped from its epoch's start, after set_epoch."
    )
    skip_samples: int = Field(description="The same in samples: indices of the rank's shard.")


class ResumeCheckOut(BaseModel):
    """Where a resume check's run was checkpointed and how it went on."""

    at_step: int = Field(description="Optimizer steps taken before the checkpoint: the first step after it.")
    epoch: int = Field(description="The epoch at_step lies in.")
    step_in_epoch: int
    data_parallel_size_before: int = Field(description="The plan's replicas, which trained up to at_step.")
    data_parallel_size_after: int = Field(description="The replicas the run went on with.")
    micro_batch_size: int | None = Field(description="After the resume (null: its replica groups differ).")
    gradient_accumulation_steps: int = Field(description="After the resume: the global batch is kept.")
    replica_groups: list[ResumedGroupOut] = Field(description="Where each group of resumed replicas started.")
    checkpoint: str = Field(description="What the checkpoint held and how the resumed ranks loaded it.")
    matches: bool = Field(
        description="Every step from at_step on within run_tolerance of the uninterrupted reference run."
    )
