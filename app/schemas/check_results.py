"""HTTP models of a gradient check's result: every key the worker's CheckResult.to_json()
writes, with its type (tests/api hold the two together)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from app.contract.check_options import CheckWorkload, DType, FitOptimizer
from app.contract.model_registry import SYNTHETIC
from app.schemas.kinds.lr_scaling import LrScalingResultField
from app.schemas.kinds.resume import ResumeResultField
from app.schemas.kinds.run import (
    ControlTrajectories,
    EpochEndOut,
    FinalParamsRelL2,
    RunTolerance,
    Trajectory,
    TrajectoryMatches,
)
from app.schemas.kinds.throughput import ThroughputResultField


class ControlOut(BaseModel):
    name: str
    description: str = ""
    rel_l2: float | None = Field(
        description="Relative L2 error of the wrong setup's gradient; for a "
        "run-level control, of its parameters after the run's last step against the reference run's; "
        "null when the control hung."
    )
    max_abs_diff: float | None = None
    detected: bool = Field(description="Its error is far above the tolerance, or it hung.")
    hung: bool = Field(
        False,
        description="The control's collective hung (ranks waited for peers that "
        "never came) and its timeout ended it: detected, with no gradient to compare.",
    )


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


class NoiseEfficiencyOut(BaseModel):
    """The measured noise scale's verdict on the global batch (as a plan's `efficiency`)."""

    batch_to_critical: float = Field(description="The global batch over the critical batch.")
    steps_vs_min: float = Field(description="Optimizer steps over the fewest possible, 1 + B_noise / B.")
    samples_vs_min: float = Field(description="Samples over the fewest possible, 1 + B / B_noise.")
    step_efficiency: float
    sample_efficiency: float
    verdict: Literal["near_critical", "above_critical", "below_critical"]


class NoiseScaleOut(BaseModel):
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
    efficiency: NoiseEfficiencyOut | None
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


class TrialOut(BaseModel):
    micro_batch_size: int
    fits: bool
    peak_bytes: int = Field(description="The step's peak (before the failure, if it did not fit).")
    error: str | None = Field(description="The out-of-memory error, if the step ran out of memory.")


class SearchedSplitOut(BaseModel):
    micro_batch_sizes: list[int] = Field(description="The distinct micro-batch sizes, ascending.")
    gradient_accumulation_steps: int


class ReplannedSplitOut(SearchedSplitOut):
    global_batch_size: int
    max_micro_batch_size: int = Field(description="The cap the plan was made under: what fits.")
    plan_request: dict[str, Any] = Field(description="The plan request that gives this split.")


class MicroBatchSearchOut(BaseModel):
    """The largest micro-batch that fits in one device's memory, and the plan re-made under it."""

    max_micro_batch_size: int = Field(description="0 when not even 1 fits.")
    capacity_bytes: int
    budget_bytes: int = Field(description="capacity_bytes less the safety margin.")
    safety_margin: float
    device: str
    optimizer: FitOptimizer
    hit_limit: bool = Field(description="The search's limit fit: the real maximum may be larger.")
    peak_bytes_at_max: int | None
    bytes_per_sample: int | None = Field(
        description="The peaks' slope over the largest complete trials; null with fewer than two."
    )
    trials: list[TrialOut] = Field(description="In the order they ran.")
    seconds: float
    search_limit: int = Field(description="The largest size tried for: no larger micro-batch can help.")
    requested: SearchedSplitOut
    planned: ReplannedSplitOut


class CheckResultOut(BaseModel):
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
    workload: CheckWorkload = Field(
        "synthetic",
        description="What ran: synthetic (samples, the synthetic or registered model's loss) or tokens "
        "(the token-normalised step and its controls), as the request chose it or, without one, the "
        "plan's loss_normalization did. The job's `request.workload` says the same.",
        examples=["tokens"],
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="What holds for the check but not for the plan as written: a tokens check of a "
        "registered model whose sequences are not the plan's sequence_length, planned in samples (the "
        "split is right, the plan's token figures assume its own length).",
        examples=[
            [
                "the model's sequences have 16 tokens, the plan's sequence_length is 32: the check ran the "
                "model's sequences (the split in samples is the plan's), but the plan's token figures "
                "(tokens per step and per micro-batch) assume 32; give sequence_length 16 for figures that "
                "count this model's tokens"
            ]
        ],
    )
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
    gradient_matches: bool = Field(description="The data-parallel step's gradient is within the tolerance.")
    controls_detected: bool = Field(description="Every control that ran was told apart.")
    device_name: str = Field(examples=["cpu", "NVIDIA H100 80GB HBM3"])
    dtype: DType
    nnodes: int = Field(description="Nodes (hosts) the check ran on.")
    global_batch_size: int
    micro_batch_sizes: list[int] = Field(description="The distinct micro-batch sizes that ran, ascending.")
    gradient_accumulation_steps: int
    split: Literal["even", "proportional"] = Field(
        description="even: DistributedSampler; proportional: micro-batches that differ by replica."
    )
    controls_not_applicable: list[str] = Field(description="The names in `controls_skipped`.")
    micro_batch_search: MicroBatchSearchOut | None = Field(
        description="With fit_micro_batch: the search, and the plan it re-made (which is what ran)."
    )
    torch_version: str
    node_rank: int | None = Field(
        description="This worker's node in a check across hosts (0 on one host); null from the rank "
        "program under torchrun."
    )
    steps: int = Field(1, description="Optimizer steps the check trained: 1 is the first step alone.")
    # A kind's result, one line a kind (app.schemas.kinds: its model, with its description); a
    # run's keys stand in the result's own object.
    trajectory: Trajectory = None
    final_params_rel_l2: FinalParamsRelL2 = None
    trajectory_matches: TrajectoryMatches = None
    run_tolerance: RunTolerance = None
    epoch_end: EpochEndOut | None = None
    control_trajectories: ControlTrajectories = None
    resume: ResumeResultField = None
    throughput: ThroughputResultField = None
    lr_scaling: LrScalingResultField = None
