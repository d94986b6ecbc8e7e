"""The answer of POST /v1/plans (PlanOut and its parts): the documented mirror of the core's
Plan dataclass, which the service serialises straight away (`plan_json`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, TypeAdapter

from app.core.records.plan import Plan
from app.schemas.plan_recipe_out import LearningRateOut
from app.schemas.recommend import RecommendationOut
from app.schemas.resume import ResumeOut
from app.schemas.stream_out import StreamOut
from app.schemas.throughput_out import ThroughputOut
from app.schemas.types import ResponseModel, with_examples

# Where they were first defined, or defined beside: still named here.


class ReplicaGroupOut(ResponseModel):
    model_config = with_examples(
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
    )

    start: int = Field(description="First data-parallel rank (inclusive).")
    stop: int = Field(description="Last data-parallel rank (exclusive).")
    node_group: str
    micro_batch_size: int
    samples_per_step: int = Field(description="micro_batch_size x gradient_accumulation_steps.")
    loss_scale: float | None = Field(
        description="Multiply each micro-batch loss by this; null under loss_normalization token, "
        "where it depends on the step's valid tokens (tokens.loss_scale_formula)."
    )
    relative_throughput: float
    max_micro_batch_size: int | None
    num_samples_per_replica: int | None
    predicted_micro_step_s: float | None = Field(
        None,
        description="With throughput curves: one micro-step of this group (micro_batch_size samples, "
        "forward and backward), in seconds, read off its curve; null without curves.",
    )


class SamplerOut(ResponseModel):
    model_config = with_examples(
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
            "leftover_micro_steps": 0,
            "leftover": "dropped",
        }
    )

    kind: str = Field(
        description="DistributedSampler when every replica takes the same micro-batch; proportional "
        "(the python export's ProportionalSampler) when they differ.",
        examples=["DistributedSampler", "proportional"],
    )
    num_replicas: int = Field(description="The sampler's num_replicas: the data-parallel replicas.")
    shuffle: bool = Field(description="As the dataset asks: the epoch's order is shuffled with seed + epoch.")
    seed: int = Field(description="The sampler's seed; set_epoch(epoch) adds the epoch to it.")
    drop_last: bool = Field(description="True: the epoch's tail that fills no whole micro-step is left out.")
    num_samples_per_replica: int | None = Field(description="null when replicas differ.")
    total_size: int = Field(
        description="Indices one epoch reads over all replicas, after padding or dropping."
    )
    padded_samples: int = Field(
        description="Indices repeated from the epoch's start to fill the last micro-step (drop_last false)."
    )
    dropped_samples: int = Field(description="Samples each epoch leaves out (drop_last true).")
    micro_steps_per_epoch: int = Field(
        description="Forward/backward passes each replica runs in an epoch: its len(DataLoader)."
    )
    optimizer_steps_per_epoch: int = Field(
        description="Whole optimizer steps per epoch: micro_steps_per_epoch // gradient_accumulation_steps."
    )
    samples_per_micro_step: int = Field(description="Samples all replicas read together in one micro-step.")
    epochs: int | None = Field(description="As dataset.epochs asks; null when it does not say.")
    total_optimizer_steps: int | None = Field(
        description="optimizer_steps_per_epoch x epochs; null without epochs."
    )
    leftover_micro_steps: int = Field(
        0,
        description="Micro-steps per epoch past the last whole optimizer step (micro_steps_per_epoch "
        "% gradient_accumulation_steps).",
    )
    leftover: Literal["dropped"] = Field(
        "dropped",
        description="What the run does with them: dropped (skipped; the next epoch starts a new "
        "optimizer step), in every export and the reference run.",
    )


class TokensOut(ResponseModel):
    model_config = with_examples(
        {
            "unit": "tokens",
            "sequence_length": 4096,
            "loss_normalization": "token",
            "tokens_per_micro_batch": 8192,
            "tokens_per_step": 4194304,
            "tokens_per_epoch": 8192000000,
            "loss_scale_formula": "sum of per-token losses over valid tokens x 16 (data_parallel_size) "
            "/ the step's global valid-token count (all-reduced over all 32 micro-batches x 16 replicas)",
        }
    )

    unit: Literal["tokens", "samples"] = Field(description="What the request gave its batch in.")
    sequence_length: int | None = Field(description="Tokens per sample; null when not given.")
    loss_normalization: Literal["sample", "token"]
    tokens_per_micro_batch: int | None = Field(
        description="Per data-parallel replica; null without sequence_length or when replicas differ."
    )
    tokens_per_step: int | None = Field(description="Per optimizer step, all replicas.")
    tokens_per_epoch: int | None = Field(
        description="What the sampler's epoch feeds (padding included); null without a dataset."
    )
    loss_scale_formula: str | None = Field(
        description="Under loss_normalization token: what each rank multiplies its summed loss by."
    )
    packing: Literal["rows", "token_budget"] | None = Field(
        None, description="The request's packing.mode; null without packing."
    )
    varies: list[str] = Field(
        default_factory=list, description="Under packing: what differs between ranks and between steps."
    )
    max_valid_targets_per_step: int | None = Field(
        None,
        description="Under packing: the most valid targets a step holds, counted as "
        "DataCollatorWithFlattening counts them (a row of sequence_length positions holding d documents "
        "has sequence_length - d; a sample of l tokens has l - 1).",
    )
    max_micro_batches_per_step: int | None = Field(
        None,
        description="Under packing: the most micro-batches one rank runs in a step (under a token "
        "budget, what its memory must hold; with rows, gradient_accumulation_steps).",
    )


class EfficiencyOut(ResponseModel):
    model_config = with_examples(
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


class MeshDimensionOut(ResponseModel):
    name: Literal["pp", "dp_replicate", "dp_shard", "cp", "tp"]
    size: int


class DeviceMeshOut(ResponseModel):
    model_config = with_examples(
        {
            "dimensions": [{"name": "dp_replicate", "size": 8}, {"name": "tp", "size": 2}],
            "data_parallel_dimensions": ["dp_replicate"],
            "data_parallel_replicate": 8,
            "data_parallel_shard": 1,
            "expert": 1,
            "wrapper": "ddp",
            "init_device_mesh": 'init_device_mesh("cuda", (8, 2), mesh_dim_names=("dp_replicate", "tp"))',
        },
        {
            "dimensions": [
                {"name": "pp", "size": 2},
                {"name": "dp_shard", "size": 4},
                {"name": "tp", "size": 4},
            ],
            "data_parallel_dimensions": ["dp_shard"],
            "data_parallel_replicate": 1,
            "data_parallel_shard": 4,
            "expert": 1,
            "wrapper": "fsdp",
            "init_device_mesh": (
                'init_device_mesh("cuda", (2, 4, 4), mesh_dim_names=("pp", "dp_shard", "tp"))'
            ),
        },
    )

    dimensions: list[MeshDimensionOut] = Field(
        description="In init_device_mesh's order (torchtitan's: pp, dp_replicate, dp_shard, cp, tp); "
        "dimensions of size 1 are left out (a single GPU is dp_replicate 1)."
    )
    data_parallel_dimensions: list[str] = Field(
        description="The sampler's group: its num_replicas is their product, its rank the rank's "
        "coordinate in them, never the global ones."
    )
    data_parallel_replicate: int
    data_parallel_shard: int
    expert: int
    wrapper: Literal["ddp", "fsdp", "hsdp"] = Field(
        description="torchtitan's (ParallelDims.fsdp_enabled): fsdp over dp_shard x cp when either is "
        "above 1, hsdp when dp_replicate is above 1 too, else ddp."
    )
    init_device_mesh: str = Field(description="The torch call that builds this mesh.")


class PlanOut(ResponseModel):
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
    tokens: TokensOut | None = Field(
        None, description="The plan in tokens; null without sequence_length and loss_normalization token."
    )
    device_mesh: DeviceMeshOut | None = Field(None, description="The mesh the plan runs on.")
    throughput: ThroughputOut | None = Field(
        None,
        description="With throughput curves: the split's predicted step and idle fraction, beside "
        "the even split's, the split by peak samples/s and the split at the fewest accumulation "
        "steps; null without curves.",
    )
    resume: ResumeOut | None = Field(None, description="With the request's resume: where the run goes on.")
    recommendation: RecommendationOut | None = Field(
        None,
        description="With the request's recommend: the law's batch and lr beside the plan's "
        "(docs/recommend.md).",
    )
    stream: StreamOut | None = Field(
        None,
        description="With dataset kind stream: how the stream splits over the ranks and their DataLoader "
        "workers, in place of the sampler (docs/streams.md).",
    )


# The adapter's serializer itself: dump_json's keyword handling is a twentieth of the answer.
_PLAN_JSON = TypeAdapter(Plan).serializer.to_json


def plan_json(plan: Plan) -> bytes:
    """The plan as PlanOut's JSON, serialised straight from the core's dataclass: the same
    bytes as `PlanOut.model_validate(plan).model_dump_json()` (tested) without validating
    what the core built."""
    return _PLAN_JSON(plan)
