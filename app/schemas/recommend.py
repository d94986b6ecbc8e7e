"""The plan request's `recommend` and the plan's `recommendation` (app.core.learning_rate.recommend),
as HTTP validates and documents them: a published scaling law's global batch and peak lr for the
model, snapped to a batch the cluster splits (docs/recommend.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from app.core.records.recommendation import Law
from app.schemas.types import RequestModel, ResponseModel, plan_limit, with_examples

RECOMMEND_HELP = (
    "Which global batch and peak lr to train with, by a published scaling law (Step Law, DeepSeek LLM): "
    "global_batch_tokens and learning_rate.base_lr may then be left out, the batch snapped to the nearest "
    "one this cluster splits exactly; given, they are kept and the law's shown beside them (the answer's "
    "`recommendation`, docs/recommend.md). Needs sequence_length."
)


class ArchitectureIn(RequestModel):
    """A decoder-only transformer's shape: batchplan counts N and M from it (docs/recommend.md)."""

    model_config = with_examples(
        {"layers": 16, "hidden_size": 2048, "ffn_hidden_size": 8192, "num_heads": 16, "gated_ffn": True},
        {
            "layers": 30,
            "hidden_size": 4096,
            "ffn_hidden_size": 11008,
            "num_heads": 32,
            "num_kv_heads": 32,
            "vocab_size": 102400,
        },
    )

    layers: Annotated[int, plan_limit("recommend.architecture.layers")]
    hidden_size: Annotated[int, plan_limit("recommend.architecture.hidden_size")]
    ffn_hidden_size: Annotated[int, plan_limit("recommend.architecture.ffn_hidden_size")] = Field(
        description="The FFN's inner width (SwiGLU: each of its gate and up matrices)."
    )
    num_heads: Annotated[int, plan_limit("recommend.architecture.num_heads")] = Field(
        description="Query heads; they must divide hidden_size."
    )
    num_kv_heads: Annotated[int, plan_limit("recommend.architecture.num_kv_heads")] | None = Field(
        None,
        description="Key/value heads (grouped-query attention); they must divide num_heads. Default: "
        "num_heads.",
    )
    vocab_size: Annotated[int, plan_limit("recommend.architecture.vocab_size")] | None = Field(
        None,
        description="Enters neither N nor M (both laws leave the embedding out); reported as "
        "embedding_params.",
    )
    gated_ffn: bool = Field(
        True, strict=True, description="Three FFN matrices (SwiGLU, both laws' models), else two."
    )


class RecommendIn(RequestModel):
    """Which global batch and peak lr to train the model with, by a published scaling law."""

    model_config = with_examples(
        {"law": "step_law", "non_embedding_params": 1073741824, "train_tokens": 100000000000},
        {
            "law": "deepseek",
            "train_tokens": 2000000000000,
            "architecture": {"layers": 30, "hidden_size": 4096, "ffn_hidden_size": 11008, "num_heads": 32},
        },
    )

    law: Law = Field(
        description="step_law: Li et al. 2025, lr 1.79 N^-0.713 D^0.307, batch 0.58 D^0.571 tokens. "
        "deepseek: DeepSeek LLM 2024, lr 0.3118 C^-0.125, batch 0.2920 C^0.3271 tokens, C = M x D."
    )
    train_tokens: Annotated[int, plan_limit("recommend.train_tokens")] = Field(
        description="D: the tokens the run trains on.", examples=[100000000000]
    )
    non_embedding_params: Annotated[int, plan_limit("recommend.non_embedding_params")] | None = Field(
        None,
        description="N: parameters without the embedding and LM head (Step Law's). Or give architecture.",
        examples=[1073741824],
    )
    flops_per_token: Annotated[float, plan_limit("recommend.flops_per_token")] | None = Field(
        None,
        description="M: non-embedding training FLOPs per token including attention, DeepSeek's (72 n_layer "
        "d_model^2 + 12 n_layer d_model l_seq for their blocks), not 6N. Or give architecture.",
        examples=[45097156608],
    )
    architecture: ArchitectureIn | None = Field(
        None,
        description="Instead of the counts: the model's shape, from which N and M are counted and reported.",
    )
    measured_noise_scale: Annotated[float, plan_limit("recommend.measured_noise_scale")] | None = Field(
        None,
        description="A measured gradient noise scale B_noise in sequences: the answer puts the critical "
        "batch (B_noise x sequence_length tokens) beside the law's. Filled in from noise_scale_check.",
        examples=[512],
    )
    noise_scale_check: (
        Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")] | None
    ) = Field(
        None,
        description="The id of a finished check on this server that measured the noise scale (a gradient "
        "check's noise_scale, or an lr-scaling probe's): its B_noise is put beside the law's batch.",
        examples=["4f9c2b7e0d1a4c6b8e3f5a7c9d2e1b0a"],
    )


class ModelCountsOut(ResponseModel):
    non_embedding_params: int | None = Field(description="N as the law read it.")
    flops_per_token: float | None = Field(description="M as the law read it.")
    counted_from: Literal["request", "architecture"]
    embedding_params: int | None = Field(
        None, description="vocab_size x hidden_size: one matrix (untied: twice)."
    )
    flops_per_token_convention: str | None = Field(
        None, description="From an architecture: how M was counted, with DeepSeek's eq. (2) beside it."
    )


class FitRangeOut(ResponseModel):
    quantity: Literal["non_embedding_params", "train_tokens", "compute", "sequence_length"]
    value: float
    low: float
    high: float
    factor_outside: float = Field(
        description="How far outside [low, high] the value lies, as a factor; 1 inside."
    )


class LawPointOut(ResponseModel):
    law: str
    batch_tokens: float | None
    lr: float | None
    within_fit: bool | None
    unavailable: str | None = Field(None, description="Why this law says nothing: the count it needs.")


class MeasuredCriticalOut(ResponseModel):
    noise_scale: float = Field(description="B_noise, in sequences.")
    critical_batch_tokens: float = Field(description="noise_scale x sequence_length.")
    source: str
    larger: Literal["law", "measured"] = Field(description="Which batch is the larger.")
    measured_to_law: float = Field(description="critical_batch_tokens / batch_tokens.")


class RecommendationOut(ResponseModel):
    model_config = with_examples(
        {
            "law": "step_law",
            "batch_tokens": 1107715.3,
            "lr": 0.001497,
            "planned_batch_tokens": 1114112,
            "planned_batch_size": 544,
            "planned_vs_law_percent": 0.58,
            "batch_from": "law",
            "lr_from": "law",
            "within_fit": True,
        }
    )

    law: str
    batch_tokens: float = Field(description="The law's global batch, tokens per optimizer step.")
    lr: float = Field(description="The law's peak lr.")
    planned_batch_tokens: int | None = Field(
        description="The nearest global batch, in whole sequences, that this cluster and parallelism split "
        "exactly (both sides of the law's tried, each planned); null when none lies near."
    )
    planned_batch_size: int | None = Field(description="The same in sequences.")
    planned_vs_law_percent: float | None = Field(description="(planned - law) / law x 100.")
    batch_from: Literal["law", "request"] = Field(description="Whose global batch the plan runs.")
    lr_from: Literal["law", "request"] = Field(description="Whose peak lr the plan runs.")
    plan_batch_to_law: float = Field(description="The plan's tokens per step over the law's batch.")
    plan_lr_to_law: float | None = Field(description="The plan's peak lr over the law's.")
    train_tokens: int
    sequence_length: int
    non_embedding_params: int | None
    flops_per_token: float | None
    compute: float | None = Field(description="C = M x D, in FLOPs (DeepSeek's).")
    model: ModelCountsOut
    within_fit: bool = Field(description="Every quantity lies in the range the law was fitted over.")
    fitted_ranges: list[FitRangeOut]
    alternatives: list[LawPointOut] = Field(description="Every other law's numbers for the same model.")
    measured: MeasuredCriticalOut | None = Field(
        description="A measured noise scale's critical batch beside the law's; null without one."
    )
    schedule: str = Field(description="The schedule and optimizer the law was fitted with.")
    sources: list[str]
    notes: list[str]
    explanation: str
