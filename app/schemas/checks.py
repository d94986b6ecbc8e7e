"""HTTP models of the gradient-check worker: /v1/checks* and /v1/host."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from app.contract.check_options import (
    DEFAULT_BACKEND,
    DEFAULT_DTYPE,
    DEFAULT_FIT_LIMIT,
    DEFAULT_FIT_OPTIMIZER,
    DEFAULT_NOISE_STEPS,
    DEFAULT_STEPS,
    MAX_STEPS,
    Backend,
    CheckWorkload,
    DType,
    FitOptimizer,
)
from app.contract.jobs import Job, JobStatus
from app.contract.model_registry import NAME, PROBE_PENDING, SYNTHETIC
from app.contract.options import FitOptions, NoiseOptions, Rendezvous
from app.contract.request import CheckOptions, CheckRequest
from app.schemas.check_examples import CHECK_EXAMPLES as CHECK_EXAMPLES  # noqa: PLC0414  (re-exported)
from app.schemas.check_results import CheckResultOut
from app.schemas.lr_scaling_probe import LrScalingRequestIn
from app.schemas.plan_requests import PlanRequestIn
from app.schemas.types import WHOLE, with_examples

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
    nnodes: Annotated[int, Field(ge=1, le=4096), WHOLE] = Field(description="Nodes taking part.")
    run_id: str = Field(
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        examples=["job-4711"],
        description="The same on every node, unique per check.",
    )


class NoiseScaleIn(BaseModel):
    """Measure the gradient noise scale over a few optimizer steps (McCandlish et al. 2018)."""

    model_config = ConfigDict(extra="forbid")

    steps: Annotated[int, Field(ge=0, le=256), WHOLE] = Field(
        DEFAULT_NOISE_STEPS,
        description="Optimizer steps, each on a fresh global batch; 0 skips the measurement.",
    )
    learning_rate: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)] = Field(
        0.0, description="Plain SGD between the steps; 0 measures every step at the starting weights."
    )


class FitMicroBatchIn(BaseModel):
    """Find the largest micro-batch that fits in one device's memory, then re-plan the same
    global batch with it (more accumulation steps rather than a smaller batch)."""

    model_config = ConfigDict(extra="forbid")

    memory_bytes: Annotated[int, Field(ge=1 << 20, le=1 << 50), WHOLE] | None = Field(
        None,
        description="The memory to fit into. Default on a GPU: its total memory; a check on CPU needs it.",
    )
    safety_margin: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] | None = Field(
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
    max_micro_batch_size: Annotated[int, Field(ge=1, le=1 << 20), WHOLE] = Field(
        DEFAULT_FIT_LIMIT, description="Where the search stops."
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
    seed: Annotated[int, Field(ge=0, le=2**31 - 1), WHOLE] = Field(
        0, description="Seeds the model's weights, the synthetic data and (without a dataset) the shuffle."
    )
    timeout_s: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] | None = Field(
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
    steps: Annotated[int, Field(ge=1, le=MAX_STEPS), WHOLE] = Field(
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
    every GET (tests/worker/test_check_result_schema.py holds that the model would serve it
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


class CheckModelOut(BaseModel):
    name: str
    status: Literal["pending", "loaded", "failed"] = Field(
        description="pending: a rank is still building the model and running a forward and backward "
        "pass on two samples (right after start-up; a check of it may already be submitted). loaded: "
        "it trains. failed: it cannot be built or trained here, `error` says why, and a check of it "
        "is refused (422 at /model). A factory whose module is not installed stops start-up instead.",
        examples=["pending"],
    )
    status_detail: str | None = Field(
        description="While pending, a sentence saying so; null otherwise.",
        examples=[PROBE_PENDING],
    )
    loaded: bool | None = Field(description="null while `status` is pending.")
    error: str | None
    description: str | None
    parameters: int | None
    dataset_size: int | None
    sequence_length: int | None = Field(
        None,
        description="Tokens per sample when the dataset yields token ids (what a tokens check "
        "compares with the plan's sequence_length); null otherwise, and while pending.",
        examples=[16],
    )
    default: bool


class CheckModelsOut(BaseModel):
    models: list[CheckModelOut]


class CheckListOut(BaseModel):
    checks: list[CheckJobOut]


class ExposureOut(BaseModel):
    listening: list[str] = Field(
        description="The addresses this server listens on (0.0.0.0 and [::]: every interface).",
        examples=[["0.0.0.0:8001"]],
    )
    api_key: bool = Field(
        description="An API key (BATCHPLAN_API_KEY) guards the worker's routes.", examples=[False]
    )
    warning: str | None = Field(
        description="Set when the worker runs checks for anyone who can reach it: no API key, and "
        "it listens beyond loopback (also logged at start-up).",
        examples=[
            "the worker runs checks for anyone who can reach 0.0.0.0:8001: no API key is set; set "
            "BATCHPLAN_API_KEY (the worker's routes then require it), or bind to 127.0.0.1"
        ],
    )


class HostProcessOut(BaseModel):
    pid: int | None = Field(description="null while the process starts.")
    state: Literal["warming", "idle", "busy", "dead"]


class HostOut(BaseModel):
    model_config = with_examples(
        {
            "worker_enabled": True,
            "ready": True,
            "not_ready_reason": None,
            "failing": None,
            "processes_per_host": 2,
            "warm_processes": 2,
            "busy_processes": 0,
            "processes": [{"pid": 4711, "state": "idle"}, {"pid": 4712, "state": "idle"}],
            "gpus": 0,
            "gpu_names": [],
            "cuda_available": False,
            "backends": ["gloo"],
            "torch_version": "2.13.0+cpu",
            "spawn_error": None,
            "queued": 0,
            "running": 0,
            "queue_size": 64,
            "concurrent_checks": 1,
            "max_replicas_per_check": 64,
            "check_timeout_s": 120.0,
            "models": [
                {
                    "name": SYNTHETIC,
                    "status": "loaded",
                    "status_detail": None,
                    "loaded": True,
                    "error": None,
                    "description": "the built-in model: an 8-16-4 tanh MLP on synthetic samples",
                    "parameters": 212,
                    "dataset_size": None,
                    "sequence_length": None,
                    "default": True,
                }
            ],
            "exposure": {"listening": ["127.0.0.1:8001"], "api_key": False, "warning": None},
        }
    )

    worker_enabled: bool
    ready: bool = Field(description="Every rank process is warm.")
    not_ready_reason: str | None = Field(None, description="Why not ready; null when ready.")
    failing: str | None = Field(None, description="Set while rank processes keep failing to start.")
    processes_per_host: int
    warm_processes: int
    busy_processes: int = 0
    processes: list[HostProcessOut] = []
    gpus: int | None = Field(description="null until the first rank process is warm.")
    gpu_names: list[str] = []
    cuda_available: bool | None = Field(None, description="null until the first rank process is warm.")
    backends: list[str]
    torch_version: str | None = Field(None, description="The ranks' torch; null until one is warm.")
    spawn_error: str | None = Field(None, description="Why the last rank process start failed, if one did.")
    queued: int = 0
    running: int = 0
    queue_size: int | None = Field(None, description="Checks that may wait; null without the worker.")
    concurrent_checks: int | None = None
    max_replicas_per_check: int | None = None
    check_timeout_s: float | None = Field(None, description="The longest timeout_s a check may ask for.")
    models: list[CheckModelOut] = Field([], description="As GET /v1/check-models lists them.")
    exposure: ExposureOut | None = Field(
        None,
        description="Who can reach the worker: where it listens and whether a key guards it.",
        examples=[{"listening": ["127.0.0.1:8001"], "api_key": True, "warning": None}],
    )
