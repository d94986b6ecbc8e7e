"""A resume check over HTTP: the request's `resume` (CheckResumeIn, with `steps` above 1), what
the result says of it (ResumeCheckOut; app.contract.kinds.resume writes it), and its Swagger
example. The plan's own `resume` (POST /v1/plans) is schemas/resume.py's."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from app.contract.kinds.resume import ResumeOptions
from app.schemas.kinds.run import two_epoch_plan
from app.schemas.types import check_limit


class CheckResumeIn(BaseModel):
    """Checkpoint the run after `at_step` optimizer steps and resume it on `data_parallel_size`
    replicas. The second topology is the same plan re-made for that many data-parallel replicas
    with the same global batch (as POST /v1/plans answers `resume.data_parallel_size`): the
    largest micro-batch that divides a replica's share within the plan's own, the rest
    accumulated; model-parallel sizes and the wrapper (DDP, FSDP2, HSDP) kept."""

    model_config = ConfigDict(extra="forbid")

    at_step: Annotated[int, check_limit("resume.at_step")] = Field(
        examples=[7],
        description="Optimizer steps taken before the checkpoint, from 1 to steps - 1: the run goes on "
        "from this step on the new replicas.",
    )
    data_parallel_size: Annotated[int, check_limit("resume.data_parallel_size")] = Field(
        examples=[2],
        description="The replicas the run goes on with, at most the plan's (the ranks beyond them idle, "
        "as a job that lost nodes); it must keep the global batch, and the plan's sampler must resume "
        "on it exactly (the plan's resume.same_global_batches).",
    )

    def to_core(self) -> ResumeOptions:
        return ResumeOptions(self.at_step, self.data_parallel_size)


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


# The fields of CheckRequestIn and CheckResultOut, one line each there.
ResumeRequestField = Annotated[
    CheckResumeIn | None,
    Field(
        description="A resume check (with steps above 1): the run checkpoints after resume.at_step steps "
        "and goes on on resume.data_parallel_size replicas, each resuming where the plan's resume says "
        "(set_epoch, then skip_micro_batches); the whole run is held against the uninterrupted "
        "single-process reference, with the resume controls (resume_without_skip, "
        "resume_schedule_restart, resume_keeps_micro_batch, resume_per_rank_position). The result's "
        "`resume` reports it; the trajectory chart marks the step.",
    ),
]
ResumeResultField = Annotated[
    ResumeCheckOut | None,
    Field(
        description="With resume: where the run was checkpointed, the replicas it went on with and where "
        "each resumed in its epoch (passed requires matches).",
    ),
]

EXAMPLES: dict[str, dict[str, Any]] = {
    "resume": {
        "summary": "Lose half the replicas mid-run: checkpoint after 7 steps on 4, resume on 2",
        "description": "The ranks train 7 optimizer steps on the plan's 4 replicas, checkpoint, and go on "
        "from step 7 on 2 (the plan re-made for 2 replicas with the same global batch: micro-batch 4, "
        "accumulation 4), each skipping what the plan's resume says; the whole run is held against the "
        "uninterrupted single-process reference, beside the resume controls. The result's `resume` "
        "says where each replica resumed.",
        "value": {
            "plan": two_epoch_plan(),
            "steps": 20,
            "resume": {"at_step": 7, "data_parallel_size": 2},
        },
    },
}
