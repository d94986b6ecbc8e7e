"""The training recipe in the answer of POST /v1/plans (LearningRateOut, the plan's
`learning_rate`): the documented mirror of the core's LearningRatePlan."""

from __future__ import annotations

from pydantic import Field

from app.schemas.types import ResponseModel, with_examples


class AdamOut(ResponseModel):
    model_config = with_examples(
        {"beta1": 0.8, "beta2": 0.998, "eps": 7.071e-09, "kappa": 2.0, "valid": True}
    )

    beta1: float
    beta2: float
    eps: float
    kappa: float
    valid: bool


class MeasuredRuleOut(ResponseModel):
    check: str | None = Field(description="The probe's check id, when the request gave it.")
    best_rule: str = Field(description="The rule the probe measured best; the plan's rule.")
    holds: bool | None = Field(description="Its run stayed within the probe's tolerance of the base run.")
    final_loss_ratio: float | None = Field(description="Its final loss over the base run's.")
    verdict: str | None = Field(description="The probe's verdict sentence.")


class LearningRateOut(ResponseModel):
    model_config = with_examples(
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
            "base_batch_tokens": None,
            "decay": "constant",
            "min_lr": 0.0,
            "milestones": [],
            "gamma": None,
            "train_steps": 225270,
            "lr_at_warmup_end": 0.2,
            "lr_at_last_step": 0.2,
            "schedule": "linear warmup from 0.1 to 0.2 over 12515 optimizer steps, then constant 0.2",
            "momentum": 0.9,
            "nesterov": False,
            "weight_decay": 0.0,
            "max_grad_norm": None,
            "betas": None,
            "eps": None,
        }
    )

    optimizer: str = Field(description="The optimizer the recipe is for, as requested.")
    rule: str = Field(description="The scaling rule applied (auto resolved to the rule it chose).")
    requested_rule: str = Field(description="The rule as requested (auto, linear, sqrt, ...).")
    base_lr: float = Field(description="The lr known to work at base_batch_size, as requested.")
    base_batch_size: int = Field(description="The global batch base_lr was tuned at, as requested.")
    factor: float = Field(
        description="What the rule multiplies base_lr by at this global batch: lr / base_lr."
    )
    lr: float = Field(description="The scaled learning rate: the peak, reached at the end of warmup.")
    warmup_steps: int = Field(description="Optimizer steps of linear warmup from warmup_start_lr to lr.")
    warmup_start_lr: float = Field(description="The lr of step 0 (lr itself without warmup).")
    adam: AdamOut | None = None
    base_batch_tokens: int | None = Field(
        None, description="As requested: the factor is then against tokens per step, not samples."
    )
    decay: str = Field("constant", description="After warmup: constant, cosine, linear or step.")
    min_lr: float = Field(0.0, description="Where cosine and linear decay end (the last step).")
    milestones: list[int] = Field(
        default_factory=list, description="Step decay's milestones in optimizer steps (epochs converted)."
    )
    gamma: float | None = Field(None, description="Step decay's factor; null for other decays.")
    train_steps: int | None = Field(
        None, description="The run's optimizer steps; null when neither the request nor dataset.epochs says."
    )
    lr_at_warmup_end: float | None = Field(None, description="The lr of step warmup_steps.")
    lr_at_last_step: float | None = Field(
        None, description="The lr of the run's last step (train_steps - 1); null when the length is unknown."
    )
    schedule: str = Field("", description="The schedule in one sentence, as every export writes it.")
    momentum: float | None = Field(None, description="SGD's and LARS's momentum; null for Adam-like.")
    nesterov: bool = False
    weight_decay: float = Field(0.0, description="As torch applies it, to every parameter.")
    max_grad_norm: float | None = Field(None, description="Gradient clipping's norm; null: no clipping.")
    betas: tuple[float, float] | None = Field(
        None,
        description="Adam-like: the betas that run (adam's when the square-root rule holds); null for SGD.",
    )
    eps: float | None = Field(None, description="Adam-like: the eps that runs; null for SGD.")
    measured: MeasuredRuleOut | None = Field(
        None,
        description='Under rule "measured": the lr-scaling probe\'s finding the rule came from; null '
        "when the rule is an assumption (the explanation says how to measure it).",
    )
