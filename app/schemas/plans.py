"""HTTP models of POST /v1/plans, with Swagger examples, and their mapping to the core."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, model_validator

from app.core import models as core
from app.core.models import MAX_SAFE_INTEGER, MAX_WORLD_SIZE
from app.schemas.types import WHOLE

MAX_NODE_GROUPS = 10_000

# Strict: JSON `true` or "32" is not a batch size.
Count = Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER), WHOLE]
GpuCount = Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE), WHOLE]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
# Strict as well: a JSON number (integer or not), never `true` or a string such as "NaN".
StrictPositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]
StrictNonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NodeGroupIn(_In):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "h100",
                    "num_nodes": 2,
                    "gpus_per_node": 8,
                    "relative_throughput": 2.0,
                    "max_micro_batch_size": 64,
                }
            ]
        },
    )

    name: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="Unique label; default `group<i>`.",
        examples=["h100"],
    )
    num_nodes: GpuCount
    gpus_per_node: GpuCount
    relative_throughput: PositiveFloat = Field(
        1.0, description="Samples per second of one GPU, relative to the others."
    )
    max_micro_batch_size: Count | None = Field(
        None, description="Largest micro-batch one GPU of this group holds."
    )


class TopologyIn(_In):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"num_nodes": 2, "gpus_per_node": 8},
                {
                    "node_groups": [
                        {"name": "h100", "num_nodes": 2, "gpus_per_node": 8, "relative_throughput": 2.0},
                        {"name": "a100", "num_nodes": 1, "gpus_per_node": 4, "relative_throughput": 1.0},
                    ]
                },
            ],
            # The two forms, as the validator below enforces them, so that schema-driven
            # clients (and fuzzers) know which requests are valid.
            "oneOf": [
                {"required": ["num_nodes", "gpus_per_node"], "not": {"required": ["node_groups"]}},
                {
                    "required": ["node_groups"],
                    "not": {"anyOf": [{"required": ["num_nodes"]}, {"required": ["gpus_per_node"]}]},
                },
            ],
        },
    )

    num_nodes: GpuCount | None = None
    gpus_per_node: GpuCount | None = None
    node_groups: list[NodeGroupIn] | None = Field(
        None,
        min_length=1,
        max_length=MAX_NODE_GROUPS,
        description="A mixed cluster, instead of num_nodes/gpus_per_node.",
    )

    @model_validator(mode="after")
    def _one_form(self) -> Self:
        homogeneous = self.num_nodes is not None or self.gpus_per_node is not None
        if homogeneous and self.node_groups is not None:
            raise ValueError("give num_nodes and gpus_per_node, or node_groups, not both")
        if self.node_groups is None and (self.num_nodes is None or self.gpus_per_node is None):
            raise ValueError("give num_nodes and gpus_per_node (or node_groups)")
        return self

    def to_core(self) -> core.Topology:
        if self.node_groups is None:
            assert self.num_nodes is not None and self.gpus_per_node is not None
            return core.Topology.homogeneous(self.num_nodes, self.gpus_per_node)
        return core.Topology(
            tuple(
                core.NodeGroup(
                    g.name or f"group{i}",
                    g.num_nodes,
                    g.gpus_per_node,
                    g.relative_throughput,
                    g.max_micro_batch_size,
                )
                for i, g in enumerate(self.node_groups)
            ),
            listed_groups=True,
        )


class ParallelismIn(_In):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"tensor": 4, "pipeline": 2, "context": 1}]}
    )

    tensor: GpuCount = 1
    pipeline: GpuCount = 1
    context: GpuCount = 1


class DatasetIn(_In):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"num_samples": 1281167, "shuffle": True, "seed": 0, "drop_last": False, "epochs": 90}
            ]
        },
    )

    num_samples: Count
    shuffle: bool = Field(True, strict=True)
    seed: Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER), WHOLE] = 0
    drop_last: bool = Field(False, strict=True)
    epochs: Annotated[int, Field(ge=1, le=1_000_000), WHOLE] | None = None


Beta = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]


class LearningRateIn(_In):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "base_lr": 0.1,
                    "base_batch_size": 256,
                    "rule": "linear",
                    "optimizer": "sgd",
                    "warmup_epochs": 5,
                }
            ]
        },
    )

    base_lr: PositiveFloat
    base_batch_size: Count = 256
    rule: core.LRRule = core.LRRule.AUTO
    optimizer: core.Optimizer = core.Optimizer.SGD
    warmup_epochs: Annotated[float, Field(ge=0, le=1_000_000, allow_inf_nan=False)] | None = None
    warmup_steps: Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER), WHOLE] | None = None
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    eps: PositiveFloat = 1e-8


class PlanRequestIn(_In):
    """Only `topology` and one of `global_batch_size` / `micro_batch_size` are required."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            # As the planner enforces it: a standard error needs the noise scale it belongs to.
            "if": {
                "required": ["gradient_noise_scale_stderr"],
                "properties": {"gradient_noise_scale_stderr": {"type": "number"}},
            },
            "then": {
                "required": ["gradient_noise_scale"],
                "properties": {"gradient_noise_scale": {"type": "number"}},
            },
        },
    )

    topology: TopologyIn
    global_batch_size: Count | None = None
    micro_batch_size: Count | None = None
    gradient_accumulation_steps: Count | None = None
    max_micro_batch_size: Count | None = None
    divisibility: core.Divisibility = core.Divisibility.EXACT
    parallelism: ParallelismIn = Field(default_factory=ParallelismIn)
    loss_reduction: core.LossReduction = core.LossReduction.MEAN
    dataset: DatasetIn | None = None
    learning_rate: LearningRateIn | None = None
    gradient_noise_scale: StrictPositiveFloat | None = Field(
        None,
        description="Gradient noise scale in samples: B_simple or B_noise measured by a check "
        "(`POST /v1/checks`). The plan then reports its global batch's step and sample "
        "efficiency against the critical batch, about this size (McCandlish et al. 2018).",
        examples=[4096],
    )
    gradient_noise_scale_stderr: StrictNonNegativeFloat | None = Field(
        None,
        description="Standard error of `gradient_noise_scale`, in samples; only with it.",
        examples=[300],
    )

    def to_core(self) -> core.PlanRequest:
        lr = self.learning_rate
        return core.PlanRequest(
            topology=self.topology.to_core(),
            global_batch_size=self.global_batch_size,
            micro_batch_size=self.micro_batch_size,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            max_micro_batch_size=self.max_micro_batch_size,
            divisibility=self.divisibility,
            parallelism=core.Parallelism(**self.parallelism.model_dump()),
            loss_reduction=self.loss_reduction,
            dataset=core.DatasetSpec(**self.dataset.model_dump()) if self.dataset else None,
            learning_rate=core.LearningRateSpec(**lr.model_dump()) if lr else None,
            gradient_noise_scale=self.gradient_noise_scale,
            gradient_noise_scale_stderr=self.gradient_noise_scale_stderr,
        )


# ------------------------------------------------------------------ responses


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class ReplicaGroupOut(_Out):
    model_config = ConfigDict(
        from_attributes=True,
        json_schema_extra={
            "examples": [
                {
                    "start": 0,
                    "stop": 16,
                    "node_group": "default",
                    "micro_batch_size": 32,
                    "samples_per_step": 32,
                    "loss_scale": 1.0,
                    "relative_throughput": 1.0,
                    "max_micro_batch_size": None,
                    "num_samples_per_replica": 80073,
                }
            ]
        },
    )

    start: int = Field(description="First data-parallel rank (inclusive).")
    stop: int = Field(description="Last data-parallel rank (exclusive).")
    node_group: str
    micro_batch_size: int
    samples_per_step: int = Field(description="micro_batch_size x gradient_accumulation_steps.")
    loss_scale: float = Field(description="Multiply each micro-batch loss by this.")
    relative_throughput: float
    max_micro_batch_size: int | None
    num_samples_per_replica: int | None


class SamplerOut(_Out):
    model_config = ConfigDict(
        from_attributes=True,
        json_schema_extra={
            "examples": [
                {
                    "kind": "DistributedSampler",
                    "num_replicas": 16,
                    "shuffle": True,
                    "seed": 0,
                    "drop_last": False,
                    "num_samples_per_replica": 80073,
                    "total_size": 1281168,
                    "padded_samples": 1,
                    "dropped_samples": 0,
                    "micro_steps_per_epoch": 2503,
                    "optimizer_steps_per_epoch": 2503,
                    "samples_per_micro_step": 512,
                    "epochs": 90,
                    "total_optimizer_steps": 225270,
                }
            ]
        },
    )

    kind: str = Field(examples=["DistributedSampler", "proportional"])
    num_replicas: int
    shuffle: bool
    seed: int
    drop_last: bool
    num_samples_per_replica: int | None = Field(description="null when replicas differ.")
    total_size: int
    padded_samples: int
    dropped_samples: int
    micro_steps_per_epoch: int
    optimizer_steps_per_epoch: int
    samples_per_micro_step: int
    epochs: int | None
    total_optimizer_steps: int | None


class AdamOut(_Out):
    model_config = ConfigDict(
        from_attributes=True,
        json_schema_extra={
            "examples": [{"beta1": 0.8, "beta2": 0.998, "eps": 7.071e-09, "kappa": 2.0, "valid": True}]
        },
    )

    beta1: float
    beta2: float
    eps: float
    kappa: float
    valid: bool


class LearningRateOut(_Out):
    model_config = ConfigDict(
        from_attributes=True,
        json_schema_extra={
            "examples": [
                {
                    "optimizer": "sgd",
                    "rule": "linear",
                    "requested_rule": "linear",
                    "base_lr": 0.1,
                    "base_batch_size": 256,
                    "factor": 2.0,
                    "lr": 0.2,
                    "warmup_steps": 12515,
                    "warmup_start_lr": 0.1,
                    "adam": None,
                }
            ]
        },
    )

    optimizer: str
    rule: str
    requested_rule: str
    base_lr: float
    base_batch_size: int
    factor: float
    lr: float
    warmup_steps: int
    warmup_start_lr: float
    adam: AdamOut | None = None


class EfficiencyOut(_Out):
    model_config = ConfigDict(
        from_attributes=True,
        json_schema_extra={
            "examples": [
                {
                    "batch_size": 512,
                    "gradient_noise_scale": 4096.0,
                    "gradient_noise_scale_stderr": 300.0,
                    "critical_batch_size": 4096.0,
                    "batch_to_critical": 0.125,
                    "steps_vs_min": 9.0,
                    "samples_vs_min": 1.125,
                    "step_efficiency": 0.1111111111111111,
                    "sample_efficiency": 0.8888888888888888,
                    "verdict": "below_critical",
                    "recommendation": "global batch 512 is 0.125x the critical batch (...)",
                }
            ]
        },
    )

    batch_size: int = Field(description="The global batch that runs (after any rounding).")
    gradient_noise_scale: float = Field(description="As requested, in samples.")
    gradient_noise_scale_stderr: float | None = Field(description="As requested; null when not given.")
    critical_batch_size: float = Field(description="B_crit, about the noise scale, in samples.")
    batch_to_critical: float = Field(description="batch_size / critical_batch_size.")
    steps_vs_min: float = Field(
        description="S/S_min = 1 + B_noise/B: optimizer steps against the fewest possible (B -> infinity)."
    )
    samples_vs_min: float = Field(
        description="E/E_min = 1 + B/B_noise: samples against the fewest possible (B -> 0)."
    )
    step_efficiency: float = Field(description="S_min/S; step_efficiency + sample_efficiency = 1.")
    sample_efficiency: float = Field(description="E_min/E.")
    verdict: Literal["near_critical", "above_critical", "below_critical"] = Field(
        description="near_critical while the batch is within 2x of the critical batch either way."
    )
    recommendation: str


class PlanOut(_Out):
    world_size: int
    model_parallel_size: int
    data_parallel_size: int
    requested_global_batch_size: int | None
    global_batch_size: int
    micro_batch_size: int | None = Field(description="The common value; null when groups differ.")
    gradient_accumulation_steps: int
    replica_groups: list[ReplicaGroupOut]
    split: str = Field(examples=["even", "proportional"])
    divisibility: str
    loss_reduction: str
    sampler: SamplerOut | None = None
    learning_rate: LearningRateOut | None = None
    warnings: list[str]
    explanation: list[str]
    efficiency: EfficiencyOut | None = Field(
        None, description="Step and sample efficiency of the global batch; null without gradient_noise_scale."
    )


PROBLEM_EXAMPLE: dict[str, JsonValue] = {
    "type": "urn:batchplan:problem:infeasible-plan",
    "title": "The batch cannot be split as requested",
    "status": 422,
    "detail": "global_batch_size 1000 is not a multiple of micro 32 x 16 replicas = 512",
    "errors": [
        {
            "pointer": "/global_batch_size",
            "detail": "global_batch_size 1000 is not a multiple of micro 32 x 16 replicas = 512",
        }
    ],
    "suggestions": {"global_batch_size": [1024, 512, 1536]},
}


class FieldErrorOut(BaseModel):
    pointer: str = Field(examples=["/global_batch_size"])
    detail: str


class ProblemOut(BaseModel):
    """RFC 9457 problem details."""

    model_config = ConfigDict(json_schema_extra={"examples": [PROBLEM_EXAMPLE]})

    type: str
    title: str
    status: int
    detail: str
    errors: list[FieldErrorOut] = []
    suggestions: dict[str, list[int]] = {}


EXAMPLES: dict[str, dict[str, Any]] = {
    "homogeneous": {
        "summary": "16 GPUs, global batch 512",
        "value": {"topology": {"num_nodes": 2, "gpus_per_node": 8}, "global_batch_size": 512},
    },
    "dataset_and_lr": {
        "summary": "ImageNet on 16 GPUs with a scaled learning rate and warmup",
        "value": {
            "topology": {"num_nodes": 2, "gpus_per_node": 8},
            "global_batch_size": 512,
            "dataset": {"num_samples": 1281167, "shuffle": True, "seed": 0, "drop_last": False, "epochs": 90},
            "learning_rate": {
                "base_lr": 0.1,
                "base_batch_size": 256,
                "rule": "linear",
                "optimizer": "sgd",
                "warmup_epochs": 5,
            },
        },
    },
    "mixed": {
        "summary": "Mixed H100 and A100 nodes, split by throughput",
        "value": {
            "topology": {
                "node_groups": [
                    {
                        "name": "h100",
                        "num_nodes": 2,
                        "gpus_per_node": 8,
                        "relative_throughput": 2.0,
                        "max_micro_batch_size": 64,
                    },
                    {
                        "name": "a100",
                        "num_nodes": 1,
                        "gpus_per_node": 4,
                        "relative_throughput": 1.0,
                        "max_micro_batch_size": 32,
                    },
                ]
            },
            "global_batch_size": 1000,
            "dataset": {"num_samples": 100000},
        },
    },
    "megatron": {
        "summary": "Tensor and pipeline parallel, capped micro-batch, Adam",
        "value": {
            "topology": {"num_nodes": 4, "gpus_per_node": 8},
            "parallelism": {"tensor": 4, "pipeline": 2, "context": 1},
            "global_batch_size": 1024,
            "max_micro_batch_size": 16,
            "learning_rate": {
                "base_lr": 0.0003,
                "base_batch_size": 256,
                "optimizer": "adamw",
                "rule": "auto",
                "warmup_steps": 2000,
            },
        },
    },
    "round_down": {
        "summary": "A batch that does not divide, moved to the nearest feasible value",
        "value": {
            "topology": {"num_nodes": 2, "gpus_per_node": 8},
            "global_batch_size": 1000,
            "micro_batch_size": 32,
            "divisibility": "round_down",
        },
    },
    "noise_scale": {
        "summary": "A measured gradient noise scale: how efficient is this global batch?",
        "value": {
            "topology": {"num_nodes": 4, "gpus_per_node": 8},
            "global_batch_size": 1024,
            "gradient_noise_scale": 4096,
            "gradient_noise_scale_stderr": 300,
        },
    },
}


_PLAN_JSON: TypeAdapter[core.Plan] = TypeAdapter(core.Plan)


def plan_json(plan: core.Plan) -> bytes:
    """The plan as PlanOut's JSON, serialised straight from the core's dataclass: the same
    bytes as `PlanOut.model_validate(plan).model_dump_json()` (tested) without validating
    what the core built."""
    return _PLAN_JSON.dump_json(plan)
