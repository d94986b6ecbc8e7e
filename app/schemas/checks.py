"""HTTP models of the gradient-check worker: /v1/checks* and /v1/host."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.core.jobs import Job
from app.core.model_registry import NAME, SYNTHETIC
from app.schemas.plan_requests import PlanRequestIn
from app.schemas.types import WHOLE

# The values of app.core.jobs.JobStatus; a Literal so the OpenAPI document lists them inline.
JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]


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
        8, description="Optimizer steps, each on a fresh global batch; 0 skips the measurement."
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
    optimizer: Literal["adam", "sgd", "none"] = Field(
        "adam", description="Whose state the probe step allocates next to the weights and gradients."
    )
    max_micro_batch_size: Annotated[int, Field(ge=1, le=1 << 20), WHOLE] = Field(
        65536, description="Where the search stops."
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
        description="Default: measured over 8 steps for a registered model, not for the synthetic one.",
    )
    fit_micro_batch: FitMicroBatchIn | None = None
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto",
        description="auto: NCCL with one rank per GPU when the host has enough GPUs, else gloo on CPU.",
    )
    dtype: Literal["float64", "float32"] = "float64"
    seed: Annotated[int, Field(ge=0, le=2**31 - 1), WHOLE] = Field(
        0, description="Seeds the model's weights, the synthetic data and (without a dataset) the shuffle."
    )
    timeout_s: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] | None = Field(
        None, description="Kill the check after this long; default and maximum from the server's settings."
    )
    rendezvous: RendezvousIn | None = None
    workload: Literal["synthetic", "tokens"] | None = Field(
        None,
        examples=["tokens"],
        description="synthetic: samples of a small regression model. tokens: a language model on "
        "sequences of varying valid length (padding ignored by the loss), checked against the mean "
        "per-token loss over the step's valid tokens, with the token-normalisation controls. "
        "Default: tokens when the plan's loss_normalization is token.",
    )


class ControlOut(BaseModel):
    name: str
    description: str = ""
    rel_l2: float = Field(description="Relative L2 error of the wrong setup's gradient.")
    max_abs_diff: float | None = None
    detected: bool = Field(description="Its error is far above the tolerance.")


class ControlSkippedOut(BaseModel):
    name: str = Field(description="The control, as `controls` names them.")
    reason: str = Field(description="Why the mistake leaves this plan's gradient as it is.")


class FindingOut(BaseModel):
    cause: str = Field(
        description="batch_norm, dropout, stochastic_depth, stochastic_forward, rank_dependent, "
        "unused_parameters, loss_over_tokens, rank_dependent_untested or unexplained."
    )
    modules: list[str]
    detail: str
    fix: str
    breaks_equivalence: bool
    fails_with_ddp_defaults: bool = Field(
        False,
        description="The gradient is right, but DistributedDataParallel with its default arguments "
        "fails at the next step (unused parameters need find_unused_parameters=True).",
        examples=[True],
    )


class EquivalenceOut(BaseModel):
    equivalent: bool = Field(
        description="The DDP step equals the single-process step, and nothing known breaks it."
    )
    summary: str
    findings: list[FindingOut]
    fails_with_ddp_defaults: bool = Field(
        False,
        description="A finding says DDP with its default arguments fails at the next step.",
        examples=[False],
    )


class NoiseStepOut(BaseModel):
    step: int
    gradient_sq: float
    trace: float
    b_simple: float | None = Field(description="The estimate after this step.")


class NoiseScaleOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    b_simple: float | None = Field(description="tr(S)/|G|^2 from the moving averages, in samples.")
    stderr: float | None = Field(description="Jackknife standard error over the steps.")
    relative_stderr: float | None
    steps: int
    decay: float
    gradient_sq: float
    trace: float
    small_batch: float
    small_batch_is: Literal["replica", "micro_batch"]
    big_batch: int
    learning_rate: float
    history: list[NoiseStepOut]
    critical_batch_size: float | None
    efficiency: dict[str, Any] | None
    recommendation: str
    reliable: bool = Field(
        True,
        description="The estimate can be acted on: the model is DDP-equivalent at this split, the "
        "steps agree in sign and it has a standard error. When false, `critical_batch_size`, "
        "`efficiency` and the recommendation are withheld.",
        examples=[False],
    )
    unreliable_because: list[str] = Field(
        default_factory=list,
        description="Why the estimate is not reliable; empty when it is.",
        examples=[
            [
                "the steps disagree in sign: 4 of 8 gave a negative |G|^2 or tr(S) estimate, so the "
                "averages are mostly noise"
            ]
        ],
    )


class MeshOut(BaseModel):
    names: list[str]
    sizes: list[int]


class CheckResultOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    passed: bool = Field(description="The gradient matched and every control was detected.")
    backend: str
    device: str
    processes: int
    data_parallel_size: int
    replicas_per_process: int
    max_abs_diff: float
    rel_l2: float
    tolerance: float
    controls: list[ControlOut]
    controls_skipped: list[ControlSkippedOut] = Field(
        default_factory=list,
        description="The controls that did not run: on this plan each mistake would give the right "
        "gradient (decided exactly over the samples it reads), so it proves nothing. With "
        "`controls`, every control appears once.",
        examples=[
            [
                {
                    "name": "unweighted_mean",
                    "reason": "every replica has the same micro-batch, so a plain mean is already right",
                },
                {
                    "name": "accumulation_not_divided",
                    "reason": "gradient_accumulation_steps is 1, so there is nothing to divide by",
                },
            ]
        ],
    )
    sampler_checked: bool | None = Field(
        None,
        description="A replica's batches were read through the plan's real sampler "
        "(DistributedSampler, or the proportional one) and matched the layout; false for an even "
        "split over more than 262,144 samples, whose layout is derived from the same "
        "torch.randperm instead of a list of every index.",
        examples=[True],
    )
    timings_s: dict[str, float]
    model: str = SYNTHETIC
    ddp_equivalence: EquivalenceOut | None = None
    noise_scale: NoiseScaleOut | None = None
    mesh: MeshOut | None = Field(
        None,
        description="The device mesh the check ran, one process per mesh rank (torchtitan's order, "
        "dimensions of size 1 left out); null for a plain DDP check.",
        examples=[{"names": ["dp_replicate", "tp"], "sizes": [2, 2]}],
    )
    wrapper: Literal["ddp", "fsdp", "hsdp"] = Field(
        "ddp",
        description="The data-parallel wrapper: ddp (whole replicas, a mean all-reduce), fsdp "
        "(fully_shard over the data-parallel group) or hsdp (replicas of shard groups).",
    )


class CheckJobOut(BaseModel):
    id: str
    status: JobStatus = Field(
        description="succeeded means the check ran; whether the plan held is result.passed."
    )
    created_at: str
    started_at: str | None
    finished_at: str | None
    result: CheckResultOut | None
    error: str | None
    request: dict[str, Any] | None = None

    @classmethod
    def from_job(cls, job: Job) -> CheckJobOut:
        stored = job.request or {}
        return cls.model_validate({**job.to_json(), "request": stored.get("body")})


class CheckModelOut(BaseModel):
    name: str
    loaded: bool | None = Field(description="null until a rank has built it.")
    error: str | None
    description: str | None
    parameters: int | None
    dataset_size: int | None
    default: bool


class CheckModelsOut(BaseModel):
    models: list[CheckModelOut]


class CheckListOut(BaseModel):
    checks: list[CheckJobOut]


class HostOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    worker_enabled: bool
    ready: bool = Field(description="Every rank process is warm.")
    processes_per_host: int
    warm_processes: int
    gpus: int | None = Field(description="null until the first rank process is warm.")
    backends: list[str]


CHECK_EXAMPLES: dict[str, dict[str, Any]] = {
    "even": {
        "summary": "4 replicas, global batch 64, 2 accumulation steps",
        "value": {
            "plan": {
                "topology": {"num_nodes": 1, "gpus_per_node": 4},
                "global_batch_size": 64,
                "micro_batch_size": 8,
            },
            "backend": "auto",
            "dtype": "float64",
            "seed": 0,
            "timeout_s": 120,
        },
    },
    "mixed": {
        "summary": "A mixed cluster with uneven micro-batches",
        "value": {
            "plan": {
                "topology": {
                    "node_groups": [
                        {"name": "h100", "num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 2.0},
                        {"name": "a100", "num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 1.0},
                    ]
                },
                "global_batch_size": 60,
                "max_micro_batch_size": 8,
            }
        },
    },
    "registered_model": {
        "summary": "An operator-registered model: equivalence, noise scale, largest micro-batch",
        "description": "The example `mlp`, which a server registers unless BATCHPLAN_CHECK_MODELS "
        "lists other models: BATCHPLAN_CHECK_MODELS=mlp=app.worker.example_models:mlp",
        "value": {
            "plan": {"topology": {"num_nodes": 1, "gpus_per_node": 4}, "global_batch_size": 256},
            "model": "mlp",
            "noise_scale": {"steps": 8, "learning_rate": 0.0},
            "fit_micro_batch": {"memory_bytes": 85899345920, "safety_margin": 0.1, "optimizer": "adam"},
        },
    },
    "tokens": {
        "summary": "A token-normalised plan on sequences of uneven length",
        "value": {
            "plan": {
                "topology": {"num_nodes": 1, "gpus_per_node": 4},
                "sequence_length": 16,
                "global_batch_tokens": 256,
                "micro_batch_tokens": 32,
                "loss_normalization": "token",
            },
            "workload": "tokens",
        },
    },
    "mesh": {
        "summary": "The plan's own mesh: 2 pipeline stages, 4 micro-batches per schedule",
        "description": "One process per mesh rank; the result reports `mesh` and `wrapper`.",
        "value": {
            "plan": {
                "topology": {"num_nodes": 1, "gpus_per_node": 2},
                "micro_batch_size": 3,
                "gradient_accumulation_steps": 4,
                "parallelism": {"pipeline": 2},
            }
        },
    },
}
