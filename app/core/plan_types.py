"""Frozen inputs and outputs of the planner. Plain dataclasses: no web types here.

The inputs live here; the outputs (Plan and its parts) in app.core.plan_result_types, re-exported
so that `plan_types.Plan` keeps working wherever it is named."""

from __future__ import annotations

from enum import StrEnum

from app.core.plan_result_types import (
    AdamAdjustment,
    BatchEfficiency,
    DeviceMeshPlan,
    LearningRatePlan,
    MeshDimension,
    Plan,
    ReplicaGroup,
    SamplerPlan,
    TokenPlan,
)
from app.core.records import record
from app.core.resume_types import ResumePlan, ResumeSpec

# Limits shared by the core and the HTTP schema (CONTRACT.md, "Limits").
MAX_SAFE_INTEGER = 2**53 - 1  # exact in every JSON client
MAX_WORLD_SIZE = 10_000_000


class Divisibility(StrEnum):
    EXACT = "exact"
    ROUND_DOWN = "round_down"
    ROUND_UP = "round_up"
    BALANCE = "balance"


class LossReduction(StrEnum):
    MEAN = "mean"
    SUM = "sum"


class LossNormalization(StrEnum):
    SAMPLE = "sample"  # each sample's loss weighs the same (the loss_reduction applies)
    TOKEN = "token"  # each valid token weighs the same: sum over tokens / the step's global count


class Optimizer(StrEnum):
    SGD = "sgd"
    LARS = "lars"
    ADAM = "adam"
    ADAMW = "adamw"
    LAMB = "lamb"


class LRRule(StrEnum):
    LINEAR = "linear"
    SQRT = "sqrt"
    NONE = "none"
    AUTO = "auto"


class Decay(StrEnum):
    """What the lr does after warmup (app.core.lr_schedule.lr_at)."""

    COSINE = "cosine"
    LINEAR = "linear"
    CONSTANT = "constant"
    STEP = "step"  # x gamma at each milestone (Goyal et al. 2017)


@record
class NodeGroup:
    name: str
    num_nodes: int
    gpus_per_node: int
    relative_throughput: float = 1.0
    max_micro_batch_size: int | None = None

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


@record
class Topology:
    node_groups: tuple[NodeGroup, ...]
    # True when the request listed node_groups; pointers in errors follow the request's shape.
    listed_groups: bool = False

    @classmethod
    def homogeneous(cls, num_nodes: int, gpus_per_node: int) -> Topology:
        return cls((NodeGroup("default", num_nodes, gpus_per_node),), listed_groups=False)

    @property
    def world_size(self) -> int:
        return sum(g.num_gpus for g in self.node_groups)


@record
class Parallelism:
    tensor: int = 1
    pipeline: int = 1
    context: int = 1
    # 1: DDP; the data-parallel size: FSDP; a proper divisor: HSDP (app.core.device_mesh).
    data_parallel_shard: int = 1
    expert: int = 1  # borrows ranks from dp_shard x cp x tp; never changes the world size

    @property
    def model_parallel_size(self) -> int:
        return self.tensor * self.pipeline * self.context


@record
class DatasetSpec:
    num_samples: int
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    epochs: int | None = None


@record
class LearningRateSpec:
    base_lr: float
    base_batch_size: int = 256
    rule: LRRule = LRRule.AUTO
    optimizer: Optimizer = Optimizer.SGD
    warmup_epochs: float | None = None
    warmup_steps: int | None = None
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    base_batch_tokens: int | None = None  # scale against tokens per step instead (app.core.tokens)
    # The rest of the recipe (app.core.recipe). None where the default depends on other fields.
    warmup_start_lr: float | None = None  # None: base_lr (Goyal et al.)
    decay: Decay | None = None  # None: constant
    min_lr: float | None = None  # None: 0 (cosine and linear decay end there)
    milestones: tuple[int, ...] | None = None  # step decay, in optimizer steps
    milestone_epochs: tuple[float, ...] | None = None  # or in epochs (needs dataset)
    gamma: float = 0.1
    train_steps: int | None = None  # the run's length; default dataset.epochs' optimizer steps
    train_samples: int | None = None
    momentum: float | None = None  # SGD and LARS; None: 0.9
    nesterov: bool = False
    weight_decay: float = 0.0  # torch's: L2 in SGD and Adam, decoupled in AdamW; every parameter
    max_grad_norm: float | None = None  # None: no clipping


@record
class PlanRequest:
    topology: Topology
    global_batch_size: int | None = None
    micro_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    max_micro_batch_size: int | None = None
    divisibility: Divisibility = Divisibility.EXACT
    parallelism: Parallelism = Parallelism()
    loss_reduction: LossReduction = LossReduction.MEAN
    dataset: DatasetSpec | None = None
    learning_rate: LearningRateSpec | None = None
    # Samples: B_simple or B_noise, as a gradient check measures it (app.core.noise_scale).
    gradient_noise_scale: float | None = None
    gradient_noise_scale_stderr: float | None = None  # only with gradient_noise_scale
    # Language models (app.core.tokens): the batch in tokens, and how the loss is normalised.
    sequence_length: int | None = None
    global_batch_tokens: int | None = None
    micro_batch_tokens: int | None = None
    loss_normalization: LossNormalization = LossNormalization.SAMPLE
    # Where a checkpointed run goes on, and on how many replicas (app.core.resume).
    resume: ResumeSpec | None = None


__all__ = [
    "MAX_SAFE_INTEGER",
    "MAX_WORLD_SIZE",
    "AdamAdjustment",
    "BatchEfficiency",
    "DatasetSpec",
    "Decay",
    "DeviceMeshPlan",
    "Divisibility",
    "LRRule",
    "LearningRatePlan",
    "LearningRateSpec",
    "LossNormalization",
    "LossReduction",
    "MeshDimension",
    "NodeGroup",
    "Optimizer",
    "Parallelism",
    "Plan",
    "PlanRequest",
    "ReplicaGroup",
    "ResumePlan",
    "ResumeSpec",
    "SamplerPlan",
    "TokenPlan",
    "Topology",
]
