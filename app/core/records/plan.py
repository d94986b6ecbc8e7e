"""Frozen outputs of the planner: the Plan and its parts. Plain dataclasses: no web types here;
app.core.records.plan_request re-exports them beside the inputs."""

from __future__ import annotations

from typing import Literal

from app.core.records.recommendation import Recommendation
from app.core.records.record import record
from app.core.records.resume import ResumePlan
from app.core.records.stream import StreamPlan

# The enumerated values of the answer's fields (the request's enums' values, in plan_types).
Split = Literal["even", "proportional"]  # DistributedSampler, or micro-batches that differ by replica
DivisibilityName = Literal["exact", "round_down", "round_up", "balance"]
LossReductionName = Literal["mean", "sum"]
Wrapper = Literal["ddp", "fsdp", "hsdp"]
LossNormalizationName = Literal["sample", "token"]
BatchUnit = Literal["samples", "tokens"]  # what a request counted its batch in
PackingModeName = Literal["rows", "token_budget"]


@record
class ReplicaGroup:
    """Consecutive data-parallel ranks [start, stop) that share every setting."""

    start: int
    stop: int
    node_group: str
    micro_batch_size: int
    samples_per_step: int
    loss_scale: float | None  # None under loss_normalization token: TokenPlan.loss_scale_formula
    relative_throughput: float
    max_micro_batch_size: int | None
    num_samples_per_replica: int | None = None
    # From the group's measured throughput curve: the time of one of its micro-steps (forward and
    # backward of micro_batch_size samples); None without curves.
    predicted_micro_step_s: float | None = None

    @property
    def count(self) -> int:
        return self.stop - self.start


@record
class SamplerPlan:
    kind: str  # "DistributedSampler" or "proportional"
    num_replicas: int
    shuffle: bool
    seed: int
    drop_last: bool
    num_samples_per_replica: int | None  # None when replicas take different shares
    total_size: int
    padded_samples: int
    dropped_samples: int
    micro_steps_per_epoch: int
    optimizer_steps_per_epoch: int
    samples_per_micro_step: int
    epochs: int | None = None
    total_optimizer_steps: int | None = None
    # Micro-steps per epoch past the last whole optimizer step, and what the run does with
    # them: "dropped" (skipped; the next epoch starts a new step), in every export and the
    # reference run alike.
    leftover_micro_steps: int = 0
    leftover: Literal["dropped"] = "dropped"


@record
class AdamAdjustment:
    beta1: float
    beta2: float
    eps: float
    kappa: float
    valid: bool


@record
class MeasuredRule:
    """The rule an lr-scaling probe measured best, as the plan took it. Field for field the
    plan's `learning_rate.measured`."""

    check: str | None  # the probe's check id, when the request gave it
    best_rule: str
    holds: bool | None  # the best rule's run stayed within tolerance of the base run
    final_loss_ratio: float | None
    verdict: str | None


@record
class LearningRatePlan:
    optimizer: str
    rule: str  # the rule applied ("auto" resolved)
    requested_rule: str
    base_lr: float
    base_batch_size: int
    factor: float
    lr: float
    warmup_steps: int
    warmup_start_lr: float
    adam: AdamAdjustment | None = None
    base_batch_tokens: int | None = None  # when set, factor is against tokens per step
    # The recipe (app.core.learning_rate.recipe), evaluated step by step by
    # app.core.learning_rate.lr_schedule.lr_at.
    decay: str = "constant"
    min_lr: float = 0.0
    milestones: tuple[int, ...] = ()
    gamma: float | None = None  # step decay only
    train_steps: int | None = None  # the run's optimizer steps, when known
    lr_at_warmup_end: float | None = None  # the lr of step warmup_steps (the peak)
    lr_at_last_step: float | None = None  # None when the run's length is unknown
    schedule: str = ""  # the schedule in one sentence, as every export writes it
    momentum: float | None = None  # SGD and LARS
    nesterov: bool = False
    weight_decay: float = 0.0
    max_grad_norm: float | None = None  # None: no clipping
    # Adam-like: the betas and eps that run (the square-root rule's when it applies and holds).
    betas: tuple[float, float] | None = None
    eps: float | None = None
    # rule "measured": the probe's finding the rule came from (app.core.learning_rate.evidence).
    measured: MeasuredRule | None = None


@record
class BatchEfficiency:
    """The plan's global batch against the critical batch B_crit ~ B_noise (McCandlish et
    al. 2018): (S/S_min - 1)(E/E_min - 1) = 1. Field for field the plan's `efficiency`."""

    batch_size: int  # the global batch that runs
    gradient_noise_scale: float
    gradient_noise_scale_stderr: float | None
    critical_batch_size: float
    batch_to_critical: float  # B / B_crit
    steps_vs_min: float  # S / S_min = 1 + B_noise / B
    samples_vs_min: float  # E / E_min = 1 + B / B_noise
    step_efficiency: float  # S_min / S
    sample_efficiency: float  # E_min / E
    verdict: str  # "near_critical", "above_critical" or "below_critical"
    recommendation: str


@record
class SplitPrediction:
    """A split of the plan's global batch, timed by the measured curves."""

    gradient_accumulation_steps: int
    predicted_step_s: float  # accumulation x the slowest replica's micro-step
    predicted_micro_step_s: float  # the slowest replica's
    idle_fraction: float  # the replicas' mean wait for the slowest, as a fraction of the step


@record
class ThroughputPlan:
    """The plan's split as the measured curves time it (app.core.split.throughput_plan), beside the
    splits it was chosen over. Field for field the plan's `throughput`."""

    predicted_step_s: float
    predicted_micro_step_s: float
    idle_fraction: float
    even: SplitPrediction  # the same samples per micro-step shared out equally
    proportional: SplitPrediction  # shared out by each curve's peak samples/s, as a scalar would
    fewest_accumulation: SplitPrediction  # the best split at the largest micro-batches that fit
    extrapolated: bool  # some replica's micro-batch lies outside its measured points


@record
class MeshDimension:
    name: str  # pp, dp_replicate, dp_shard, cp or tp
    size: int


@record
class DeviceMeshPlan:
    """The mesh in init_device_mesh's order (torchtitan's: pp, dp_replicate, dp_shard, cp,
    tp), dimensions of size 1 left out."""

    dimensions: tuple[MeshDimension, ...]
    data_parallel_dimensions: tuple[str, ...]  # the sampler's group: dp_replicate x dp_shard
    data_parallel_replicate: int
    data_parallel_shard: int
    expert: int
    wrapper: Wrapper
    init_device_mesh: str  # the call, to paste


@record
class Plan:
    world_size: int
    model_parallel_size: int
    data_parallel_size: int
    requested_global_batch_size: int | None
    global_batch_size: int
    micro_batch_size: int | None  # None when replica groups differ
    gradient_accumulation_steps: int
    replica_groups: tuple[ReplicaGroup, ...]
    split: Split
    divisibility: DivisibilityName
    loss_reduction: LossReductionName
    sampler: SamplerPlan | None
    learning_rate: LearningRatePlan | None
    warnings: tuple[str, ...]
    explanation: tuple[str, ...]
    efficiency: BatchEfficiency | None = None  # when the request gives gradient_noise_scale
    tokens: TokenPlan | None = None  # with sequence_length or loss_normalization token
    device_mesh: DeviceMeshPlan | None = None  # always set by the planner
    throughput: ThroughputPlan | None = None  # with throughput curves
    resume: ResumePlan | None = None  # with the request's resume (app.core.resume.plan_resume)
    recommendation: Recommendation | None = None  # with the request's recommend
    stream: StreamPlan | None = None  # a stream dataset's split, in place of the sampler


@record
class TokenPlan:
    """The plan counted in tokens (app.core.tokens.token_plan). Counts are None without sequence_length,
    and per-replica ones also when replicas take different micro-batches."""

    unit: BatchUnit
    sequence_length: int | None
    loss_normalization: LossNormalizationName
    tokens_per_micro_batch: int | None  # per data-parallel replica
    tokens_per_step: int | None  # per optimizer step, all replicas
    tokens_per_epoch: int | None  # what the sampler's epoch feeds, padding included
    loss_scale_formula: str | None  # under token: what each rank multiplies its summed loss by
    # Under `packing` (app.core.tokens.packing); None / empty without it.
    packing: PackingModeName | None = None
    varies: tuple[str, ...] = ()  # what differs between ranks and between steps
    max_valid_targets_per_step: int | None = None  # counted as DataCollatorWithFlattening counts
    max_micro_batches_per_step: int | None = None  # per rank: what its memory must hold in a step
