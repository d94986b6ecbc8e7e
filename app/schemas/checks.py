"""HTTP models of the gradient-check worker: /v1/checks* and /v1/host."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from app.contract.check_options import (
    DEFAULT_BACKEND,
    DEFAULT_DTYPE,
    DEFAULT_FIT_LIMIT,
    DEFAULT_FIT_OPTIMIZER,
    DEFAULT_NOISE_STEPS,
    DEFAULT_STEPS,
    Backend,
    CheckWorkload,
    DType,
    FitOptimizer,
)
from app.contract.jobs import Job, JobStatus
from app.contract.model_registry import NAME, SYNTHETIC
from app.contract.options import FitOptions, NoiseOptions, Rendezvous, ResumeOptions
from app.contract.request import CheckOptions, CheckRequest
from app.schemas.check_examples import CHECK_EXAMPLES as CHECK_EXAMPLES  # noqa: PLC0414  (re-exported)
from app.schemas.check_results import CheckResultOut
from app.schemas.lr_scaling_probe import LrScalingRequestIn
from app.schemas.measured_throughput import ThroughputIn
from app.schemas.plan_requests import PlanRequestIn
from app.schemas.types import check_limit

# app.contract.jobs.JobStatus's values, listed inline in the OpenAPI document (as a Literal would
# list them) rather than as a schema of their own: in a job, and as the list's query parameter.
_STATUSES = [s.value for s in JobStatus]
Status = Annotated[str, AfterValidator(JobStatus), WithJsonSchema({"type": "string", "enum": _STATUSES})]
StatusQuery = Annotated[str, AfterValidator(JobStatus), WithJsonSchema({"enum": _STATUSES, "type": "string"})]


class RendezvousIn(BaseModel):
    """One check across several worker hosts: send the same request to the worker on every
    node; they meet at `endpoint` and run as one process group."""

    model_config = ConfigDict(extra="forbid")

    endpoint: str = Field(
        pattern=r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]{1,253}):[0-9]{1,5}$",
        examples=["node0.example:29400"],
        description="HOST:PORT; the first node on HOST serves the rendezvous there.",
    )
    nnodes: Annotated[int, check_limit("rendezvous.nnodes")] = Field(description="Nodes taking part.")
    run_id: str = Field(
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        examples=["job-4711"],
        description="The same on every node, unique per check.",
    )


class NoiseScaleIn(BaseModel):
    """Measure the gradient noise scale over a few optimizer steps (McCandlish et al. 2018)."""

    model_config = ConfigDict(extra="forbid")

    steps: Annotated[int, check_limit("noise_scale.steps")] = Field(
        DEFAULT_NOISE_STEPS,
        description="Optimizer steps, each on a fresh global batch; 0 skips the measurement.",
    )
    learning_rate: Annotated[float, check_limit("noise_scale.learning_rate")] = Field(
        0.0, description="Plain SGD between the steps; 0 measures every step at the starting weights."
    )


class FitMicroBatchIn(BaseModel):
    """Find the largest micro-batch that fits in one device's memory, then re-plan the same
    global batch with it (more accumulation steps rather than a smaller batch)."""

    model_config = ConfigDict(extra="forbid")

    memory_bytes: Annotated[int, check_limit("fit_micro_batch.memory_bytes")] | None = Field(
        None,
        description="The memory to fit into. Default on a GPU: its total memory; a check on CPU needs it.",
    )
    safety_margin: Annotated[float, check_limit("fit_micro_batch.safety_margin")] | None = Field(
        None,
        description="Fraction of memory_bytes kept free (fragmentation, other processes). Default: "
        "0.1 on a GPU, where the caching allocator's peak is measured; 0.15 on CPU, where the count "
        "of live tensor storage misses convolution scratch space (4-7 % against torch.profiler).",
        examples=[0.1],
    )
    optimizer: FitOptimizer = Field(
        DEFAULT_FIT_OPTIMIZER,
        description="Whose state the probe step allocates next to the weights and gradients.",
    )
    max_micro_batch_size: Annotated[int, check_limit("fit_micro_batch.max_micro_batch_size")] = Field(
        DEFAULT_FIT_LIMIT, description="Where the search stops."
    )


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


class CheckRequestIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan: PlanRequestIn
    model: str = Field(
        SYNTHETIC,
        pattern=NAME.pattern,
        examples=[SYNTHETIC],
        description="A check model by its registered name (GET /v1/check-models); operators register "
        "their own with BATCHPLAN_CHECK_MODELS. Never an import path.",
    )
    noise_scale: NoiseScaleIn | None = Field(
        None,
        description=f"Default: measured over {DEFAULT_NOISE_STEPS} steps for a registered model, not for "
        "the synthetic one.",
    )
    fit_micro_batch: FitMicroBatchIn | None = None
    backend: Backend = Field(
        DEFAULT_BACKEND,
        description="auto: NCCL with one rank per GPU when the host has enough GPUs, else gloo on CPU.",
    )
    dtype: DType = DEFAULT_DTYPE
    seed: Annotated[int, check_limit("seed")] = Field(
        0, description="Seeds the model's weights, the synthetic data and (without a dataset) the shuffle."
    )
    timeout_s: Annotated[float, check_limit("timeout_s")] | None = Field(
        None, description="Kill the check after this long; default and maximum from the server's settings."
    )
    rendezvous: RendezvousIn | None = None
    workload: CheckWorkload | None = Field(
        None,
        examples=["tokens"],
        description="synthetic: samples of a small regression model. tokens: a language model on "
        "sequences of varying valid length (padding ignored by the loss), checked against the mean "
        "per-token loss over the step's valid tokens, with the token-normalisation controls. "
        "Default: tokens when the plan's loss_normalization is token.",
    )
    steps: Annotated[int, check_limit("steps")] = Field(
        DEFAULT_STEPS,
        examples=[20],
        description="Optimizer steps to train. 1: the first step's gradient against the single-process "
        "one. More: after that first step the ranks train the plan's recipe (learning_rate: its "
        "optimizer, schedule, weight decay, clipping; without one, SGD at 0.1) over the plan's sampler "
        "across epochs, and every step is held against a single-process reference run, with the "
        "run-level controls (scheduler_per_micro_batch, scheduler_per_process, set_epoch_missing, "
        "clip_before_all_reduce). Without a dataset the run gets one whose epoch holds ceil(steps / 2) "
        "optimizer steps, so it crosses an epoch boundary.",
    )
    resume: CheckResumeIn | None = Field(
        None,
        description="A resume check (with steps above 1): the run checkpoints after resume.at_step steps "
        "and goes on on resume.data_parallel_size replicas, each resuming where the plan's resume says "
        "(set_epoch, then skip_micro_batches); the whole run is held against the uninterrupted "
        "single-process reference, with the resume controls (resume_without_skip, "
        "resume_schedule_restart, resume_keeps_micro_batch, resume_per_rank_position). The result's "
        "`resume` reports it; the trajectory chart marks the step.",
    )
    throughput: ThroughputIn | None = Field(
        None,
        description="After the check, time one replica's micro-step at each micro-batch size (the "
        "result's `throughput`: its points, the fastest and the knee, and the curve a plan takes).",
    )
    lr_scaling: LrScalingRequestIn | None = Field(
        None,
        description="An lr-scaling probe after the first step: does the plan's scaled lr train as well "
        "as the base batch did? Needs plan.learning_rate.",
    )

    def to_core(self) -> CheckRequest:
        """The request in core types, as /v1/plans reads its plan: validated once, here."""
        noise, fit, meet = self.noise_scale, self.fit_micro_batch, self.rendezvous
        return CheckRequest(
            self.plan.to_core(),
            CheckOptions(
                model=self.model,
                noise_scale=NoiseOptions(noise.steps, noise.learning_rate) if noise else None,
                fit_micro_batch=FitOptions(
                    fit.memory_bytes, fit.safety_margin, fit.optimizer, fit.max_micro_batch_size
                )
                if fit
                else None,
                backend=self.backend,
                dtype=self.dtype,
                seed=self.seed,
                timeout_s=self.timeout_s,
                rendezvous=Rendezvous(meet.endpoint, meet.nnodes, meet.run_id) if meet else None,
                workload=self.workload,
                steps=self.steps,
                resume=ResumeOptions(self.resume.at_step, self.resume.data_parallel_size)
                if self.resume
                else None,
                throughput=None if self.throughput is None else self.throughput.to_core(),
                lr_scaling=self.lr_scaling.to_core() if self.lr_scaling else None,
            ),
        )


class CheckJobOut(BaseModel):
    id: str
    status: Status = Field(
        title="Status", description="succeeded means the check ran; whether the plan held is result.passed."
    )
    created_at: str
    started_at: str | None
    finished_at: str | None
    result: CheckResultOut | None
    error: str | None
    request: dict[str, Any] | None = Field(
        None,
        description="The check request as its schema read it, with `workload` set to the one that "
        "runs (a token-normalised plan runs tokens unless the request says otherwise).",
    )


def job_json(job: Job) -> dict[str, Any]:
    """The job as `CheckJobOut` documents it, from what the store holds: its result is the
    codec's JSON of the rank's CheckResult, served as it is stored, not validated again on
    every GET (tests/worker/checks/test_check_result_schema.py holds that the model would serve it
    unchanged)."""
    return {
        "id": job.id,
        "status": job.status.value,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "result": job.result,
        "error": job.error,
        "request": job.submission.get("body"),
    }


class CheckListOut(BaseModel):
    checks: list[CheckJobOut]
