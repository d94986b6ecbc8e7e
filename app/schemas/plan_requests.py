"""The body of POST /v1/plans (PlanRequestIn and its parts), as validated and documented.

Building the core's PlanRequest from it is app.core.request.parse's job, shared with the rank
program, which reads the same JSON without pydantic.
"""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import (
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from app.core.records import plan_request as core
from app.core.request import parse as core_request
from app.schemas.checked_suggestions import with_checked_suggestions
from app.schemas.dataset_in import DatasetIn
from app.schemas.packing_in import PackingIn
from app.schemas.plan_recipe_in import LearningRateIn
from app.schemas.recommend import RECOMMEND_HELP, RecommendIn
from app.schemas.resume import ResumeIn
from app.schemas.types import RequestModel, plan_limit, with_examples

# LearningRateIn lives in plan_recipe_in, DatasetIn in dataset_in; app.schemas.exports (and
# users) name them here.
__all__ = [
    "SCREEN",
    "CurvePointIn",
    "DatasetIn",
    "NodeGroupIn",
    "ParallelismIn",
    "PlanRequestIn",
    "TopologyIn",
]

SCREEN = {"screen": True}
"""Validation context for a caller that only asks whether a body is valid and leaves the
answer to an invalid one to the route (app.api.plan_fast_path): a schema error is then raised
without its checked suggestions, which cost up to a dozen plans."""


CURVE_HELP = (
    "Measured samples per second of one data-parallel replica at each micro-batch it ran "
    "(`POST /v1/checks` with `throughput` gives it in this form), micro-batch sizes strictly "
    "increasing and within the cap. With curves the split minimises the slowest replica's "
    "predicted micro-step time, and the accumulation count is the one with the shortest "
    "predicted step (docs/throughput-curves.md)."
)


class CurvePointIn(RequestModel):
    model_config = with_examples({"micro_batch_size": 16, "samples_per_s": 1840.0})

    micro_batch_size: Annotated[int, plan_limit("topology.throughput_curve[].micro_batch_size")]
    samples_per_s: Annotated[float, plan_limit("topology.throughput_curve[].samples_per_s")] = Field(
        description="Samples per second at this micro-batch (at least 1e-6: a measured rate)."
    )


ThroughputCurveIn = Annotated[
    list[CurvePointIn],
    plan_limit("topology.throughput_curve"),
    Field(
        description=CURVE_HELP,
        examples=[
            [
                {"micro_batch_size": 8, "samples_per_s": 960.0},
                {"micro_batch_size": 16, "samples_per_s": 1840.0},
                {"micro_batch_size": 32, "samples_per_s": 2400.0},
                {"micro_batch_size": 64, "samples_per_s": 2500.0},
            ]
        ],
    ),
]


class NodeGroupIn(RequestModel):
    model_config = with_examples(
        {
            "name": "h100",
            "num_nodes": 2,
            "gpus_per_node": 8,
            "relative_throughput": 2.0,
            "max_micro_batch_size": 64,
        }
    )

    name: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="Unique label; default `group<i>`.",
        examples=["h100"],
    )
    num_nodes: Annotated[int, plan_limit("topology.node_groups[].num_nodes")]
    gpus_per_node: Annotated[int, plan_limit("topology.node_groups[].gpus_per_node")]
    relative_throughput: Annotated[float, plan_limit("topology.node_groups[].relative_throughput")] = Field(
        1.0, description="Samples per second of one GPU, relative to the others."
    )
    max_micro_batch_size: Annotated[int, plan_limit("topology.node_groups[].max_micro_batch_size")] | None = (
        Field(None, description="Largest micro-batch one GPU of this group holds.")
    )
    throughput_curve: ThroughputCurveIn | None = Field(
        None, description="Instead of relative_throughput: this group's measured curve. " + CURVE_HELP
    )


class TopologyIn(RequestModel):
    model_config = ConfigDict(
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
                    "not": {
                        "anyOf": [
                            {"required": ["num_nodes"]},
                            {"required": ["gpus_per_node"]},
                            {"required": ["throughput_curve"]},
                        ]
                    },
                },
            ],
        },
    )

    num_nodes: Annotated[int, plan_limit("topology.num_nodes")] | None = None
    gpus_per_node: Annotated[int, plan_limit("topology.gpus_per_node")] | None = None
    throughput_curve: ThroughputCurveIn | None = Field(
        None, description="With num_nodes and gpus_per_node: the replicas' measured curve. " + CURVE_HELP
    )
    node_groups: Annotated[list[NodeGroupIn], plan_limit("topology.node_groups")] | None = Field(
        None,
        description="A mixed cluster, instead of num_nodes/gpus_per_node.",
    )

    @model_validator(mode="after")
    def _one_form(self) -> Self:
        homogeneous = self.num_nodes is not None or self.gpus_per_node is not None
        if homogeneous and self.node_groups is not None:
            raise ValueError("give num_nodes and gpus_per_node, or node_groups, not both")
        if self.throughput_curve is not None and self.node_groups is not None:
            raise ValueError("with node_groups, give each group its own throughput_curve")
        if self.node_groups is None and (self.num_nodes is None or self.gpus_per_node is None):
            raise ValueError("give num_nodes and gpus_per_node (or node_groups)")
        return self


class ParallelismIn(RequestModel):
    model_config = with_examples({"tensor": 4, "pipeline": 2, "context": 1})

    tensor: Annotated[int, plan_limit("parallelism.tensor")] = 1
    pipeline: Annotated[int, plan_limit("parallelism.pipeline")] = 1
    context: Annotated[int, plan_limit("parallelism.context")] = 1
    data_parallel_shard: Annotated[int, plan_limit("parallelism.data_parallel_shard")] = Field(
        1,
        description="FSDP shard group size: 1 is DDP, the data-parallel size is FSDP, a proper "
        "divisor is HSDP with data_parallel_size / data_parallel_shard replicas.",
    )
    expert: Annotated[int, plan_limit("parallelism.expert")] = Field(
        1,
        description="Expert-parallel size: borrows ranks, never changes the world size; a multiple "
        "of context x tensor that divides data_parallel_shard x context x tensor (torchtitan).",
    )


class PlanRequestIn(RequestModel):
    """Only `topology` and one of `global_batch_size` / `micro_batch_size` are required."""

    model_config = ConfigDict(
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
    global_batch_size: Annotated[int, plan_limit("global_batch_size")] | None = None
    micro_batch_size: Annotated[int, plan_limit("micro_batch_size")] | None = None
    gradient_accumulation_steps: Annotated[int, plan_limit("gradient_accumulation_steps")] | None = None
    max_micro_batch_size: Annotated[int, plan_limit("max_micro_batch_size")] | None = None
    divisibility: core.Divisibility = core.Divisibility.EXACT
    parallelism: ParallelismIn = Field(default_factory=ParallelismIn)
    loss_reduction: core.LossReduction = core.LossReduction.MEAN
    dataset: DatasetIn | None = None
    learning_rate: LearningRateIn | None = None
    gradient_noise_scale: Annotated[float, plan_limit("gradient_noise_scale")] | None = Field(
        None,
        description="Gradient noise scale in samples: B_simple or B_noise measured by a check "
        "(`POST /v1/checks`). The plan then reports its global batch's step and sample "
        "efficiency against the critical batch, about this size (McCandlish et al. 2018).",
        examples=[4096],
    )
    gradient_noise_scale_stderr: Annotated[float, plan_limit("gradient_noise_scale_stderr")] | None = Field(
        None,
        description="Standard error of `gradient_noise_scale`, in samples; only with it.",
        examples=[300],
    )
    sequence_length: Annotated[int, plan_limit("sequence_length")] | None = Field(
        None,
        description="Tokens per sample (sequence). The plan then reports `tokens`, and the batch "
        "may be given in tokens.",
        examples=[4096],
    )
    global_batch_tokens: Annotated[int, plan_limit("global_batch_tokens")] | None = Field(
        None,
        description="Tokens per optimizer step, instead of global_batch_size: a whole number of "
        "sequences (needs sequence_length).",
        examples=[4194304],
    )
    micro_batch_tokens: Annotated[int, plan_limit("micro_batch_tokens")] | None = Field(
        None,
        description="Tokens per micro-batch per data-parallel rank (torchtitan's local_batch_size "
        "x seq_len), instead of micro_batch_size: a whole number of sequences.",
        examples=[8192],
    )
    loss_normalization: core.LossNormalization = Field(
        core.LossNormalization.SAMPLE,
        description="sample: each sample weighs the same (loss_reduction applies). token: each valid "
        "token of the step weighs the same; each rank sums its per-token losses, divides by the "
        "step's global valid-token count and multiplies by data_parallel_size (tokens."
        "loss_scale_formula), and replica_groups' loss_scale is null.",
    )
    packing: PackingIn | None = Field(
        None,
        description="Packed rows or a token budget (needs sequence_length and loss_normalization token): "
        "the answer's `tokens` then says what varies per rank and per step, max_valid_targets_per_step, "
        "max_micro_batches_per_step and the exact loss scale with the plan's numbers.",
    )
    resume: ResumeIn | None = Field(
        None,
        description="Resume a checkpointed run of this plan, perhaps on another data-parallel size: the "
        "answer's `resume` says where in the data each rank goes on, the lr there, and whether every later "
        "step sees the uninterrupted run's global batch (docs/resume.md).",
    )
    recommend: RecommendIn | None = Field(None, description=RECOMMEND_HELP)

    @model_validator(mode="wrap")
    @classmethod
    def _checked_suggestions(
        cls, data: Any, handler: ModelWrapValidatorHandler[Self], info: ValidationInfo
    ) -> Self:
        """On a schema error, suggest only values that plan (app.schemas.checked_suggestions);
        a valid body pays one function call."""
        try:
            return handler(data)
        except ValidationError as err:
            if info.context is SCREEN:
                raise
            raise with_checked_suggestions(data, err, handler) from None

    def to_core(self) -> core.PlanRequest:
        return core_request.plan_request(self)
