"""HTTP models of the gradient-check worker: /v1/checks* and /v1/host."""

from __future__ import annotations

from typing import Annotated, Any, Protocol, runtime_checkable

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
from app.contract.options import FitOptions, NoiseOptions, Rendezvous
from app.contract.request import CheckOptions, CheckRequest
from app.schemas.check_results import CheckResultOut
from app.schemas.kinds.lr_scaling import LrScalingRequestField
from app.schemas.kinds.resume import ResumeRequestField
from app.schemas.kinds.throughput import ThroughputRequestField
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

    def to_core(self) -> Rendezvous:
        return Rendezvous(self.endpoint, self.nnodes, self.run_id)


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

    def to_core(self) -> NoiseOptions:
        return NoiseOptions(self.steps, self.learning_rate)


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

    def to_core(self) -> FitOptions:
        return FitOptions(self.memory_bytes, self.safety_margin, self.optimizer, self.max_micro_batch_size)


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
    # A kind's options, one line a kind (app.schemas.kinds: its model, with its description).
    resume: ResumeRequestField = None
    throughput: ThroughputRequestField = None
    lr_scaling: LrScalingRequestField = None

    def to_core(self) -> CheckRequest:
        """The request in core types, as /v1/plans reads its plan: validated once, here. Every
        other field is CheckOptions' of the same name; an option's model gives its record."""
        options = {name: _core(getattr(self, name)) for name in type(self).model_fields if name != "plan"}
        return CheckRequest(self.plan.to_core(), CheckOptions(**options))


@runtime_checkable
class _Option(Protocol):
    """A request model that stands for a record of the contract."""

    def to_core(self) -> object: ...


def _core(value: Any) -> Any:
    return value.to_core() if isinstance(value, _Option) else value


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
