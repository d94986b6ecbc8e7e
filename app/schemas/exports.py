"""HTTP models of the export and schedule endpoints, with Swagger examples. The elastic
endpoint's are in app/schemas/elastic.py; its examples are re-exported here, where callers
have always imported them."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

from app.contract.check_options import MAX_STEPS
from app.core.exports.parts.export_types import ExportOptions
from app.core.learning_rate import schedule as core_schedule
from app.core.records.plan_request import Decay
from app.core.records.schedule import Rampup, ScheduleSpec
from app.schemas.examples import plan_example
from app.schemas.plan_requests import PlanRequestIn
from app.schemas.types import WHOLE, Count, RequestModel, ResponseModel, with_examples


class ExportOptionsIn(BaseModel):
    """Query parameters of POST /v1/plans/export/{format}."""

    script: str = Field(
        "train.py",
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9_./-]+$",
        description="The training script torchrun starts on every node.",
    )
    job_name: str = Field(
        "batchplan",
        min_length=1,
        max_length=63,
        pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
        description="Slurm job name and PyTorchJob name: a DNS-1035 label (a letter first), short "
        "enough that the PyTorchJob's pod names `<name>-worker-<i>` stay within 63 characters.",
    )
    image: str = Field(
        ExportOptions().image,
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9_./:@-]+$",
        description="Container image of the PyTorchJob (the export's default is a placeholder).",
    )
    port: int = Field(
        29500,
        ge=1024,
        le=65535,
        description="Rendezvous (master) port; slurm adds the job id modulo 10000 (at most to 65535), "
        "so that jobs sharing a node do not share a rendezvous.",
    )
    preflight: bool = Field(
        True,
        description="slurm, torchrun, kubernetes: run the plan's gradient check (`python -m "
        "app.worker.gradcheck`) under the same torchrun line before training, and stop the job, with "
        "the reason in its output, if the plan does not hold there. The job's environment needs "
        "batchplan installed. false leaves it out.",
    )
    preflight_steps: int = Field(
        1,
        ge=1,
        le=MAX_STEPS,
        examples=[20],
        description="Optimizer steps the preflight trains: 1, the first step's gradient; more, a run of "
        "the plan's recipe checked step by step, as POST /v1/checks does with `steps` (docs/runs.md).",
    )
    model_factory: str | None = Field(
        None,
        max_length=256,
        pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$",
        description="Your `package.module:factory` (see the check models): the python export builds "
        "its loop around it (its model, dataset and loss); the preflight trains it instead of the "
        "built-in model. Formats that write no model refuse it.",
        examples=["app.worker.example_models:mlp"],
    )
    setup: Annotated[str, Field(min_length=1, max_length=512, pattern=r"^[^\r\n]+$")] | None = Field(
        None,
        description="slurm, torchrun: one shell line that activates the job's environment (under "
        "`sbatch --export=NONE` nothing of the submitting shell is inherited).",
        examples=["source /shared/venvs/train/bin/activate"],
    )
    cpus_per_gpu: int = Field(
        4, ge=1, le=256, description="slurm: CPU cores per GPU process (--cpus-per-task per node)."
    )
    rampup_batch_size: str | None = Field(
        None,
        pattern=r"^[1-9][0-9]{0,15},[1-9][0-9]{0,15},[1-9][0-9]{0,15}$",
        examples=["128,128,5000000"],
        description="megatron only: START,INCREMENT,SAMPLES for --rampup-batch-size (as in "
        "POST /v1/plans/schedule); warmup and run length are then written in samples.",
    )

    elastic_nodes: str | None = Field(
        None,
        pattern=r"^[1-9][0-9]{0,4}:[1-9][0-9]{0,4}$",
        examples=["1:4"],
        description="torchrun, slurm: an elastic launch on MIN:MAX nodes (--nnodes MIN:MAX, a c10d "
        "rendezvous, --max-restarts): when a node is lost the workers restart on the rest, and the python "
        "export resumes from its checkpoint with the plan for the new world size (docs/resume.md). Every "
        "node count in the range must keep the global batch; only even plans.",
    )
    max_restarts: int = Field(
        3, ge=0, le=100, description="torchrun, slurm: --max-restarts of an elastic launch (elastic_nodes)."
    )

    def to_core(self) -> ExportOptions:
        ramp = self.rampup_batch_size
        nodes = self.elastic_nodes
        start, increment, samples = (int(v) for v in ramp.split(",")) if ramp else (0, 0, 0)
        return ExportOptions(
            script=self.script,
            job_name=self.job_name,
            image=self.image,
            port=self.port,
            rampup=(start, increment, samples) if ramp else None,
            preflight=self.preflight,
            preflight_steps=self.preflight_steps,
            model_factory=self.model_factory,
            setup=self.setup,
            cpus_per_gpu=self.cpus_per_gpu,
            elastic=(int(nodes.split(":")[0]), int(nodes.split(":")[1])) if nodes else None,
            max_restarts=self.max_restarts,
        )


# ----------------------------------------------------------------------------- schedule


class RampupIn(RequestModel):
    model_config = with_examples(
        {"start_batch_size": 32, "batch_size_increment": 32, "rampup_samples": 200000}
    )

    start_batch_size: Count
    batch_size_increment: Count
    rampup_samples: Count = Field(description="Samples consumed before the batch reaches its target.")


# Every stage of a ramp-up splits into whole micro-batches (micro x data-parallel size divides
# the start and the increment): micro-batch 8 on 16 GPUs ramps 128, 256, 384 to the plan's 512.
SCHEDULE_REQUEST_EXAMPLE: dict[str, Any] = {
    "plan": {**plan_example("dataset_and_lr"), "micro_batch_size": 8},
    "rampup": {"start_batch_size": 128, "batch_size_increment": 128, "rampup_samples": 5000000},
    "decay": "cosine",
    "min_lr": 0.0,
}


class ScheduleRequestIn(RequestModel):
    """A plan and how its run unfolds: Megatron-style batch ramp-up, lr warmup and decay."""

    model_config = with_examples(SCHEDULE_REQUEST_EXAMPLE)

    plan: PlanRequestIn
    train_steps: Count | None = Field(
        None,
        description="Optimizer steps in the run; default: the plan's (learning_rate.train_steps or "
        "train_samples, else dataset.epochs' total_optimizer_steps). Replaces the recipe's run length.",
    )
    rampup: RampupIn | None = None
    decay: Decay | None = Field(
        None,
        description="Replaces the plan's learning_rate.decay in this answer; default: the plan's "
        "(constant unless it says). Better given in the plan, where the exports read it.",
        examples=["cosine"],
    )
    min_lr: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="Replaces the plan's learning_rate.min_lr (the lr at the last step under cosine "
        "and linear decay) in this answer; default: the plan's.",
        examples=[0.0],
    )
    max_points: Annotated[int, Field(ge=2, le=core_schedule.MAX_POINTS), WHOLE] = Field(
        500, description="Most points in the series."
    )

    def to_core(self) -> ScheduleSpec:
        r = self.rampup
        return ScheduleSpec(
            train_steps=self.train_steps,
            rampup=Rampup(r.start_batch_size, r.batch_size_increment, r.rampup_samples) if r else None,
            decay=self.decay,
            min_lr=self.min_lr,
            max_points=self.max_points,
        )


class StageOut(ResponseModel):
    first_step: int
    steps: int
    global_batch_size: int
    gradient_accumulation_steps: int


class SchedulePointOut(ResponseModel):
    step: int = Field(description="Optimizer step, from 0.")
    consumed_samples: int = Field(description="Samples consumed before this step.")
    global_batch_size: int
    gradient_accumulation_steps: int
    lr: float | None


SCHEDULE_EXAMPLE: dict[str, Any] = {
    "train_steps": 1000,
    "train_samples": 504000,
    "rampup_steps": 31,
    "warmup_steps": 100,
    "peak_lr": 0.2,
    "min_lr": 0.0,
    "decay": "cosine",
    "stages": [
        {"first_step": 0, "steps": 16, "global_batch_size": 256, "gradient_accumulation_steps": 1},
        {"first_step": 16, "steps": 984, "global_batch_size": 512, "gradient_accumulation_steps": 2},
    ],
    "points": [
        {
            "step": 0,
            "consumed_samples": 0,
            "global_batch_size": 256,
            "gradient_accumulation_steps": 1,
            "lr": 0.1,
        }
    ],
    "downsampled": True,
    "warnings": [],
    "warmup_start_lr": 0.1,
    "milestones": [],
    "schedule": "linear warmup from 0.1 to 0.2 over 100 optimizer steps, then cosine decay from 0.2 to "
    "0.0 at the last step (999)",
}


class ScheduleResumeOut(ResponseModel):
    optimizer_step: int = Field(description="The step the run goes on with.")
    consumed_samples: int = Field(
        description="Samples consumed before it (Megatron's consumed_train_samples)."
    )
    global_batch_size: int = Field(description="The global batch at that step (the ramp's).")
    data_parallel_size: int
    micro_batch_size: int | None
    gradient_accumulation_steps: int = Field(description="At that step, on data_parallel_size replicas.")
    skip_micro_batches: int = Field(
        description="Micro-batches each rank skips: from the data's start under a ramp-up (consumed_samples "
        "/ (micro x data_parallel_size), where Megatron's sampler starts), else from the epoch's start."
    )
    lr: float | None = Field(description="The schedule's lr at that step.")
    remaining_steps: int
    same_global_batches: bool
    why: str | None
    epoch: int | None = Field(
        description="Null under a ramp-up: Megatron's samplers count samples, not epochs."
    )
    step_in_epoch: int | None


class ScheduleOut(ResponseModel):
    model_config = with_examples(SCHEDULE_EXAMPLE)

    train_steps: int = Field(description="Optimizer steps in the run the series covers.")
    train_samples: int = Field(description="Samples those steps consume together.")
    rampup_steps: int = Field(
        description="Steps before the global batch reaches its full size (0 without ramp-up)."
    )
    warmup_steps: int = Field(
        description="Steps of linear lr warmup, as the plan's learning_rate gives them."
    )
    peak_lr: float | None = Field(description="The lr at the end of warmup; null without learning_rate.")
    min_lr: float | None = Field(description="The floor the decay ends at; null without learning_rate.")
    decay: str = Field(description="After warmup: constant, cosine, linear or step.")
    stages: list[StageOut] = Field(description="Runs of steps with one global batch.")
    points: list[SchedulePointOut]
    downsampled: bool = Field(description="True when the series holds a subset of the steps.")
    warnings: list[str] = Field(
        description="The plan's warnings, as POST /v1/plans gives them (one about min_lr follows this "
        "answer's decay and min_lr), then the schedule's own."
    )
    warmup_start_lr: float | None = Field(None, description="The lr of step 0; null without learning_rate.")
    milestones: list[int] = Field(default_factory=list, description="Step decay's milestones.")
    schedule: str | None = Field(
        None, description="The recipe in one sentence (the plan's learning_rate.schedule, with this run)."
    )
    resume: ScheduleResumeOut | None = Field(
        None,
        description="With the plan's resume: where the run goes on. Under a ramp-up by consumed samples only "
        "(the batch follows them); without one, the plan's own resume (POST /v1/plans).",
    )
