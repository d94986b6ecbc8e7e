"""The published batch and learning-rate scaling laws, with the constants as printed and the
ranges they were fitted over. Batches are in tokens per optimizer step.

- Step Law (Li et al. 2025, "Predictable Scale: Part I", arXiv 2503.04715): peak lr
  1.79 N^-0.713 D^0.307 and batch 0.58 D^0.571 tokens, N the non-embedding parameters, D the
  training tokens. The constants are the paper's, its site's and its calculator's (the means
  of the authors' 1,000 bootstrap fits, rounded: repository step-law/steplaw). Fitted on dense
  models of 214.7M to 1.07B parameters (N = layers x (4 h^2 + 3 h ffn)), 4B to 100B tokens,
  sequences of 2048 tokens, AdamW, cosine decay to a fixed min lr of 1e-5.
- DeepSeek LLM (DeepSeek-AI 2024, arXiv 2401.02954, eq. 1): lr 0.3118 C^-0.125 and batch
  0.2920 C^0.3271 tokens, C = M x D FLOPs with M the non-embedding FLOPs per token including
  attention (eq. 2: 72 n_layer d^2 + 12 n_layer d l_seq), not 6N. Fitted at 1e17 to 2e19
  FLOPs with a multi-step schedule (80% and 90% of the tokens) and AdamW.

A new law is one `ScalingLaw` and one line in `LAWS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from app.core.records.recommendation import Law
from app.core.records.record import record


def step_law_lr(non_embedding_params: float, train_tokens: float) -> float:
    return 1.79 * math.pow(non_embedding_params, -0.713) * math.pow(train_tokens, 0.307)


def step_law_batch_tokens(train_tokens: float) -> float:
    return 0.58 * math.pow(train_tokens, 0.571)


def deepseek_lr(compute: float) -> float:
    return 0.3118 * math.pow(compute, -0.125)


def deepseek_batch_tokens(compute: float) -> float:
    return 0.2920 * math.pow(compute, 0.3271)


@record
class Inputs:
    """What a law may read: N, D, M and the sequence length (None where not known)."""

    non_embedding_params: int | None
    train_tokens: int
    flops_per_token: float | None
    sequence_length: int


@record
class Fitted:
    """A quantity a law was fitted over, and how it is read off the inputs."""

    quantity: str
    low: float
    high: float
    value: Callable[[Inputs], float | None]


@record
class ScalingLaw:
    law: Law
    title: str  # how sentences name it
    needs: str  # the count it cannot do without besides train_tokens: a field of `recommend`
    batch_formula: str
    lr_formula: str
    evaluate: Callable[[Inputs], tuple[float, float] | None]  # (batch tokens, lr), None: lacks `needs`
    fitted: tuple[Fitted, ...]
    schedule: str
    sources: tuple[str, ...]


def _step_law(x: Inputs) -> tuple[float, float] | None:
    if x.non_embedding_params is None:
        return None
    return step_law_batch_tokens(x.train_tokens), step_law_lr(x.non_embedding_params, x.train_tokens)


def compute_of(x: Inputs) -> float | None:
    """DeepSeek's C = M x D, in FLOPs."""
    return None if x.flops_per_token is None else x.flops_per_token * x.train_tokens


def _deepseek(x: Inputs) -> tuple[float, float] | None:
    compute = compute_of(x)
    if compute is None:
        return None
    return deepseek_batch_tokens(compute), deepseek_lr(compute)


# Where a law is an extrapolation: the released dense grid's N (214,663,680 to 1,073,741,824)
# and D; DeepSeek's compute budgets of the fit (eq. 1 was then checked at 1e20).
STEP_LAW_MIN_LR = 1e-5
DEEPSEEK_MILESTONES = (0.8, 0.9)  # fractions of the run's tokens
DEEPSEEK_GAMMA = math.sqrt(0.1)  # 31.6% of the peak after the first milestone, 10% after the second
DEEPSEEK_WARMUP_STEPS = 2000
DEEPSEEK_BETAS = (0.9, 0.95)
DEEPSEEK_WEIGHT_DECAY = 0.1
DEEPSEEK_MAX_GRAD_NORM = 1.0

LAWS: dict[Law, ScalingLaw] = {
    Law.STEP_LAW: ScalingLaw(
        law=Law.STEP_LAW,
        title="Step Law (Li et al. 2025)",
        needs="non_embedding_params",
        batch_formula="0.58 x D^0.571",
        lr_formula="1.79 x N^-0.713 x D^0.307",
        evaluate=_step_law,
        fitted=(
            Fitted("non_embedding_params", 214_663_680, 1_073_741_824, lambda x: x.non_embedding_params),
            Fitted("train_tokens", 4e9, 1e11, lambda x: x.train_tokens),
            Fitted("sequence_length", 2048, 2048, lambda x: x.sequence_length),
        ),
        schedule="AdamW, warmup, then cosine decay to a fixed min lr of 1e-5 (the optimum moves when "
        "min lr is max lr / 10)",
        sources=(
            "Li et al. 2025, Predictable Scale: Part I - Optimal Hyperparameter Scaling Law in Large "
            "Language Model Pretraining (Step Law), arXiv:2503.04715",
            "https://github.com/step-law/steplaw (released grid: data/dense_lr_bs_loss.csv; fits: "
            "data/1004_fitted_lr_bs_scaling_model_parameters.csv)",
            "https://step-law.github.io (the authors' calculator, the same constants)",
        ),
    ),
    Law.DEEPSEEK: ScalingLaw(
        law=Law.DEEPSEEK,
        title="DeepSeek LLM (DeepSeek-AI 2024)",
        needs="flops_per_token",
        batch_formula="0.2920 x C^0.3271",
        lr_formula="0.3118 x C^-0.1250",
        evaluate=_deepseek,
        fitted=(Fitted("compute", 1e17, 2e19, compute_of),),
        schedule="AdamW (betas 0.9, 0.95; weight decay 0.1; gradient clipping 1.0), 2000 warmup "
        "steps, then the lr stepped to 31.6% of its peak after 80% of the tokens and to 10% after 90%",
        sources=(
            "DeepSeek-AI 2024, DeepSeek LLM: Scaling Open-Source Language Models with Longtermism, "
            "arXiv:2401.02954, eq. (1) and (2), Tables 2 and 3",
            "https://github.com/deepseek-ai/DeepSeek-LLM",
        ),
    ),
}


def factor_outside(value: float, low: float, high: float) -> float:
    """How far outside [low, high] a value lies, as a factor: 1.0 inside."""
    if value > high:
        return value / high
    if value < low:
        return low / value
    return 1.0
