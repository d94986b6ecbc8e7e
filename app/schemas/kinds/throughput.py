"""A check's throughput measurement over HTTP: the request's `throughput` (ThroughputIn), what
the result holds (MeasuredThroughputOut, key for key the codec's JSON of
app.contract.kinds.throughput.Throughput), and its Swagger example."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from app.contract.check_options import (
    DEFAULT_KNEE_MARGIN,
    DEFAULT_THROUGHPUT_LIMIT,
    DEFAULT_THROUGHPUT_REPEATS,
    DEFAULT_THROUGHPUT_WARMUP,
)
from app.contract.kinds.throughput import ThroughputOptions
from app.schemas.types import check_limit

MicroBatch = Annotated[int, check_limit("throughput.micro_batch_sizes[]")]
Sizes = Annotated[list[MicroBatch], check_limit("throughput.micro_batch_sizes")]


class ThroughputIn(BaseModel):
    """Time one replica's micro-step of the check's model at each micro-batch size, after the
    check, on rank 0's device (alone: on CPU the ranks share the cores), and answer with the
    curve that topology.throughput_curve and node_groups[].throughput_curve take."""

    model_config = ConfigDict(extra="forbid")

    micro_batch_sizes: Sizes | None = Field(
        None,
        examples=[[1, 2, 4, 8, 16, 32, 64, 128]],
        description="Strictly increasing, each at most the plan's cap (max_micro_batch_size, or every "
        "node group's). Default: powers of two up to that cap (and the cap), up to what "
        f"fit_micro_batch finds when it runs, else up to {DEFAULT_THROUGHPUT_LIMIT}.",
    )
    repeats: Annotated[int, check_limit("throughput.repeats")] = Field(
        DEFAULT_THROUGHPUT_REPEATS,
        description="Timed repeats per size; a point's step_time_s is their median. A repeat times as "
        "many micro-steps as last 10 ms together.",
    )
    warmup_steps: Annotated[int, check_limit("throughput.warmup_steps")] = Field(
        DEFAULT_THROUGHPUT_WARMUP, description="Micro-steps run before the clock starts, per size."
    )
    time_optimizer_step: bool = Field(
        False,
        description="false: a micro-step is a forward and a backward that accumulates, as under "
        "gradient accumulation. true: each also zeroes the gradients and takes an AdamW step.",
    )
    margin: Annotated[float, check_limit("throughput.margin")] = Field(
        DEFAULT_KNEE_MARGIN,
        description="knee_micro_batch_size is the smallest micro-batch within this fraction of the "
        "fastest samples/s.",
    )

    def to_core(self) -> ThroughputOptions:
        sizes = None if self.micro_batch_sizes is None else tuple(self.micro_batch_sizes)
        return ThroughputOptions(
            sizes, self.repeats, self.warmup_steps, self.time_optimizer_step, self.margin
        )


class ThroughputPointOut(BaseModel):
    micro_batch_size: int
    step_time_s: float = Field(description="The median micro-step over the repeats, in seconds.")
    spread: float = Field(description="The repeats' interquartile range over their median (spread_is).")
    samples_per_s: float = Field(description="micro_batch_size / step_time_s.")
    tokens_per_s: float | None = Field(
        description="Token plans: samples_per_s x the sequence length; null otherwise."
    )
    peak_memory_bytes: int | None = Field(
        description="The device allocator's peak over this size's steps (CUDA); null on CPU."
    )
    micro_steps_per_repeat: int = Field(description="Micro-steps each repeat timed (10 ms or more).")
    repeats: int = Field(
        description="The repeats the median is over: more than asked where the point was remeasured "
        "(its spread above spread_bound after the asked repeats)."
    )
    noisy: bool = Field(
        description="Its spread is above spread_bound even after remeasuring: the host was busy; "
        "the result's warnings say what to do."
    )


class CurvePointOut(BaseModel):
    micro_batch_size: int
    samples_per_s: float


class MeasuredThroughputOut(BaseModel):
    """One replica's micro-step timed at each micro-batch size, on rank 0's device."""

    points: list[ThroughputPointOut] = Field(description="By micro_batch_size, ascending.")
    margin: float = Field(description="The knee's margin below the fastest samples/s.")
    repeats: int
    warmup_steps: int
    time_optimizer_step: bool
    spread_is: str = Field(description="What a point's spread is.")
    device: str = Field(examples=["cpu", "cuda:0"])
    threads: int = Field(description="torch's intra-op threads on the measuring rank.")
    measured_by: str = Field(description="Which rank measured, and whether alone.")
    out_of_memory_at: int | None = Field(
        description="The first micro-batch that ran out of device memory; the larger were not measured."
    )
    seconds: float = Field(description="The measurement's own time.")
    spread_bound: float = Field(
        description="A point whose spread is above it is remeasured, then flagged noisy."
    )
    warnings: list[str] = Field(
        description="Noisy points, and a step that took less time at a larger micro-batch: what to do "
        "(an idle host, more repeats) before planning from the curve."
    )
    fastest_micro_batch_size: int = Field(description="The point with the most samples/s.")
    knee_micro_batch_size: int = Field(
        description="The smallest micro-batch within `margin` of the fastest samples/s."
    )
    curve: list[CurvePointOut] = Field(
        description="The points as topology.throughput_curve (or a node group's) takes them: send it "
        "back to POST /v1/plans as it is."
    )


# The fields of CheckRequestIn and CheckResultOut, one line each there.
ThroughputRequestField = Annotated[
    ThroughputIn | None,
    Field(
        description="After the check, time one replica's micro-step at each micro-batch size (the "
        "result's `throughput`: its points, the fastest and the knee, and the curve a plan takes).",
    ),
]
ThroughputResultField = Annotated[
    MeasuredThroughputOut | None,
    Field(
        description="With `throughput`: one replica's micro-step timed at each micro-batch size "
        "(GET /v1/checks/{id}/throughput.png draws it).",
    ),
]

EXAMPLES: dict[str, dict[str, Any]] = {
    "throughput": {
        "summary": "Measure the throughput curve: samples/s of one replica at 8 micro-batch sizes",
        "description": "After the check, rank 0 times one replica's micro-step at each size; the "
        "result's `throughput.curve` is what topology.throughput_curve takes.",
        "value": {
            "plan": {
                "topology": {"num_nodes": 1, "gpus_per_node": 2},
                "global_batch_size": 64,
                "max_micro_batch_size": 128,
            },
            "throughput": {"micro_batch_sizes": [1, 2, 4, 8, 16, 32, 64, 128], "repeats": 10},
        },
    },
}
