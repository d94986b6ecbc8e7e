"""The lr-scaling probe over HTTP (docs/lr-scaling.md): the check request's `lr_scaling`
(LrScalingRequestIn) and the result's (LrScalingOut). A plan takes the result back through
schemas/lr_scaling_in.py (the plan request's model: its `NoiseScaleIn` keeps the component name
OpenAPI gives it there)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.contract.check_options import (
    DEFAULT_LR_PROBE_POINTS,
    DEFAULT_LR_PROBE_TOLERANCE,
)
from app.contract.kinds.lr_scaling import LrScalingOptions
from app.schemas.types import check_limit


class LrScalingRequestIn(BaseModel):
    """An lr-scaling probe (docs/lr-scaling.md): the base run and each rule's run at the plan's
    global batch, over the same samples, on the same held-out batch."""

    model_config = ConfigDict(extra="forbid")

    samples: Annotated[int, check_limit("lr_scaling.samples")] = Field(
        examples=[65536],
        description="How far every run trains, in samples (rounded down to whole global batches); at "
        "least one global batch (and one base batch).",
    )
    rules: Annotated[list[Literal["none", "sqrt", "linear"]], check_limit("lr_scaling.rules")] | None = Field(
        None,
        examples=[["sqrt", "linear"]],
        description="The rules to run at the plan's global batch. Default: none, sqrt and linear; the "
        "plan's own rule is added when missing.",
    )
    points: Annotated[int, check_limit("lr_scaling.points")] = Field(
        DEFAULT_LR_PROBE_POINTS, description="Held-out evaluations along the way (and one at 0 samples)."
    )
    tolerance: Annotated[float, check_limit("lr_scaling.tolerance")] = Field(
        DEFAULT_LR_PROBE_TOLERANCE,
        description="A rule holds while its final held-out loss is at most (1 + tolerance) x the base run's.",
    )
    label_noise: Annotated[float, check_limit("lr_scaling.label_noise")] = Field(
        0.0,
        examples=[0.5],
        description="The built-in model's gradient-noise knob: the standard deviation of Gaussian noise "
        "added to its training targets (a fixed draw per sample; the held-out targets stay clean). "
        "Raises the gradient noise scale B_noise. 0 with a registered model or tokens.",
    )

    def to_core(self) -> LrScalingOptions:
        return LrScalingOptions(
            self.samples,
            tuple(self.rules) if self.rules is not None else None,
            self.points,
            self.tolerance,
            self.label_noise,
        )


class LossPointOut(BaseModel):
    samples: int = Field(description="Training samples the run had taken.")
    loss: float | None = Field(description="Its mean loss on the held-out batch; null once it diverged.")


class ProbeBaseOut(BaseModel):
    batch_size: int = Field(description="The plan's base_batch_size.")
    lr: float = Field(description="The plan's base_lr.")
    curve: list[LossPointOut]


class ProbeRuleOut(BaseModel):
    rule: str = Field(examples=["linear"])
    lr: float = Field(description="The lr this rule gives the plan's global batch.")
    curve: list[LossPointOut]
    final_loss_ratio: float | None = Field(
        description="Its final held-out loss over the base run's; null when it diverged."
    )
    holds: bool = Field(description="final_loss_ratio is at most 1 + tolerance.")


class ProbeNoiseOut(BaseModel):
    start: float | None = Field(description="B_simple at the initial weights; null: not measurable.")
    end: float | None = Field(description="B_simple after the base run; null: not measurable.")
    batch_to_noise: float | None = Field(description="The global batch over B_noise (start, else end).")
    linear_overshoot: float | None = Field(
        description="McCandlish et al. 2018: how far linear scaling from the base batch overshoots the "
        "best lr, (B + B_noise) / (b + B_noise)."
    )


class LrScalingOut(BaseModel):
    """An lr-scaling probe's answer (docs/lr-scaling.md); give it back to a plan as
    learning_rate.lr_scaling (rule "measured")."""

    samples: int = Field(description="Samples every run trained: a whole number of global batches.")
    global_batch_size: int
    tolerance: float = Field(description="How far above the base run's final loss a rule may end and hold.")
    label_noise: float = Field(description="The built-in model's target noise the probe trained with.")
    base: ProbeBaseOut
    rules: list[ProbeRuleOut]
    best_rule: str = Field(description="The rule with the lowest final held-out loss.")
    plan_rule: str = Field(description="The rule the plan scales by.")
    plan_rule_holds: bool
    noise_scale: ProbeNoiseOut
    regime: Literal["below_noise_scale", "around_noise_scale", "above_noise_scale", "unknown"] = Field(
        description="The global batch against B_noise: below a quarter of it (linear should hold), "
        "above four times it (linear should not), or around it."
    )
    verdict: str


# The fields of CheckRequestIn and CheckResultOut, one line each there.
LrScalingRequestField = Annotated[
    LrScalingRequestIn | None,
    Field(
        description="An lr-scaling probe after the first step: does the plan's scaled lr train as well "
        "as the base batch did? Needs plan.learning_rate.",
    ),
]
LrScalingResultField = Annotated[
    LrScalingOut | None,
    Field(
        description="With lr_scaling in the request: the probe's base run and each rule's run at the "
        "plan's global batch, their held-out loss curves and the verdict "
        "(GET /v1/checks/{id}/lr_scaling.png draws them).",
    ),
]


# Swagger's example of POST /v1/checks with a probe (app/schemas/check_examples.py lists it).
EXAMPLES: dict[str, dict[str, Any]] = {
    "lr_scaling": {
        "summary": "Does the plan's sqrt rule train as well as the base batch? An lr-scaling probe",
        "description": "The base run (batch 32 at lr 0.005) and one run per rule (none, sqrt, linear) at the "
        "global batch 256, each over 16,384 samples with the plan's warmup and decay counted in samples; "
        "the result's `lr_scaling` has each run's held-out loss curve, `best_rule`, `plan_rule_holds` and "
        "the verdict (docs/lr-scaling.md). A probe that cannot finish within timeout_s is refused with the "
        "estimate.",
        "value": {
            "plan": {
                "topology": {"num_nodes": 1, "gpus_per_node": 2},
                "global_batch_size": 256,
                "learning_rate": {
                    "base_lr": 0.005,
                    "base_batch_size": 32,
                    "rule": "sqrt",
                    "warmup_steps": 8,
                    "decay": "linear",
                    "train_samples": 65536,
                },
            },
            "lr_scaling": {"samples": 16384},
        },
    },
}
