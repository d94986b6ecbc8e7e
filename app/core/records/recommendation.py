"""The records of a recommendation (app.core.learning_rate.recommend): what the plan request's
`recommend` asks (a published scaling law, the training tokens, the model), and what the plan's
`recommendation` answers. Plain records, no logic."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from app.core.records.record import record


class Law(StrEnum):
    STEP_LAW = "step_law"  # Li et al. 2025, "Predictable Scale: Part I"
    DEEPSEEK = "deepseek"  # DeepSeek-AI 2024, "DeepSeek LLM", eq. (1)


@record
class Architecture:
    """A decoder-only transformer's shape: what N (non-embedding parameters) and M
    (non-embedding FLOPs per token) are counted from (app.core.learning_rate.model_counts)."""

    layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int | None = None  # None: num_heads (multi-head attention)
    vocab_size: int | None = None  # enters neither N nor M; reported as the embedding's size
    gated_ffn: bool = True  # SwiGLU-style: three FFN matrices, else two


@record
class RecommendSpec:
    """The request's `recommend`: the law, D, and the model as counts or as an architecture."""

    law: Law
    train_tokens: int
    non_embedding_params: int | None = None
    flops_per_token: float | None = None
    architecture: Architecture | None = None
    # A measured gradient noise scale B_noise (samples), to put the critical batch beside the
    # law's: given, or filled in by the server from the finished check named below.
    measured_noise_scale: float | None = None
    noise_scale_check: str | None = None


Side = Literal["law", "request"]


@record
class ModelCounts:
    """N and M as the law used them, and where they came from."""

    non_embedding_params: int | None
    flops_per_token: float | None
    counted_from: Literal["request", "architecture"]
    embedding_params: int | None = None  # vocab_size x hidden_size: one matrix (untied: twice)
    # How M was counted from the architecture, in words, with DeepSeek's eq. (2) beside it.
    flops_per_token_convention: str | None = None


@record
class FitRange:
    """One quantity a law was fitted over: the model's value against the fitted range, and how
    far outside it lies as a factor (1.0 inside)."""

    quantity: str  # non_embedding_params, train_tokens, compute or sequence_length
    value: float
    low: float
    high: float
    factor_outside: float


@record
class LawPoint:
    """What one law says for the model: the peak lr and the global batch in tokens, or why it
    says nothing (it needs a count the request does not give)."""

    law: str
    batch_tokens: float | None
    lr: float | None
    within_fit: bool | None
    unavailable: str | None = None


@record
class MeasuredCritical:
    """A measured gradient noise scale as a critical batch in tokens, beside the law's batch."""

    noise_scale: float  # B_noise in samples (sequences)
    critical_batch_tokens: float  # B_noise x sequence_length
    source: str
    larger: Literal["law", "measured"]
    measured_to_law: float  # critical_batch_tokens / the law's batch_tokens


@record
class Recommendation:
    """The plan's `recommendation`: the law's numbers, the batch this cluster splits nearest to
    them, and what the plan took from them."""

    law: str
    batch_tokens: float  # the law's own
    lr: float  # the law's own (peak lr)
    planned_batch_tokens: int | None  # the nearest whole-sequence batch this cluster splits exactly
    planned_batch_size: int | None  # the same in sequences
    planned_vs_law_percent: float | None  # (planned - law) / law x 100
    batch_from: Side  # whose batch the plan runs
    lr_from: Side  # whose peak lr the plan runs
    plan_batch_to_law: float  # the plan's tokens per step / the law's batch_tokens
    plan_lr_to_law: float | None  # the plan's peak lr / the law's; None without learning_rate
    train_tokens: int
    sequence_length: int
    non_embedding_params: int | None
    flops_per_token: float | None
    compute: float | None  # C = M x D (DeepSeek's)
    model: ModelCounts
    within_fit: bool
    fitted_ranges: tuple[FitRange, ...]
    alternatives: tuple[LawPoint, ...]
    measured: MeasuredCritical | None
    schedule: str  # the schedule the law was fitted with, in words
    sources: tuple[str, ...]
    notes: tuple[str, ...]
    explanation: str
