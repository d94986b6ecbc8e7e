"""The lr-scaling probe over HTTP (docs/lr-scaling.md): the check request's `lr_scaling`
(LrScalingRequestIn) and the result's (LrScalingOut). A plan takes the result back through
schemas/lr_scaling_in.py (the plan request's model: its `NoiseScaleIn` keeps the component name
OpenAPI gives it there)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.contract.check_options import (
    DEFAULT_LR_PROBE_NATS,
    DEFAULT_LR_PROBE_POINTS,
    DEFAULT_LR_PROBE_SEEDS,
    DEFAULT_LR_PROBE_TOLERANCE,
)
from app.contract.kinds.lr_scaling import LrScalingOptions
from app.schemas.types import check_limit


class LrScalingRequestIn(BaseModel):
    """An lr-scaling probe (docs/lr-scaling.md): the base run and each rule's run at the plan's
    global batch, over the same samples, on the same held-out batch."""

    model_config = ConfigDict(extra="forbid")

    samples: Annotated[int, check_limit("lr_scaling.samples")] | None = Field(
        None,
        examples=[65536],
        description="How far every run trains, in samples (rounded down to whole global batches); at "
        "least one global batch (and one base batch). Default: the plan's whole run "
        "(learning_rate.train_steps, or dataset.epochs, x the global batch): near convergence a "
        "shorter probe favours the faster-falling small batch.",
    )
    epochs: Annotated[float, check_limit("lr_scaling.epochs")] | None = Field(
        None,
        examples=[5],
        description="Or how far in passes over plan.dataset (not with samples).",
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
    tolerance: Annotated[float, check_limit("lr_scaling.tolerance")] | None = Field(
        None,
        examples=[0.05],
        description="How far above the base run's final held-out loss a rule may end and hold, in "
        f"tolerance_unit. Default: {DEFAULT_LR_PROBE_TOLERANCE} relative, {DEFAULT_LR_PROBE_NATS} nats "
        "for the tokens workload.",
    )
    tolerance_unit: Literal["relative", "nats"] | None = Field(
        None,
        description="relative: a rule holds at most (1 + tolerance) x the base run's final loss (a loss "
        "that falls towards zero); nats: at most tolerance above it (a cross-entropy, whose floor is "
        "far from zero). Default: nats for the tokens workload, else relative.",
    )
    seeds: Annotated[int, check_limit("lr_scaling.seeds")] = Field(
        DEFAULT_LR_PROBE_SEEDS,
        description="Initialisations and sample streams every run is trained from, each rule paired "
        "with the same seed's base run; a rule whose seeds fall on both sides of the tolerance is "
        "borderline. The probe's time grows with it.",
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
            self.epochs,
            self.seeds,
            self.tolerance_unit,
        )


class LossPointOut(BaseModel):
    samples: int = Field(description="Training samples the run had taken.")
    loss: float | None = Field(description="Its mean loss on the held-out batch; null once it diverged.")


class ProbeBaseOut(BaseModel):
    batch_size: int = Field(description="The plan's base_batch_size.")
    lr: float = Field(description="The plan's base_lr.")
    curve: list[LossPointOut] = Field(description="The first seed's.")
    last_interval_fall: float | None = Field(
        description="How far its held-out loss fell over the last interval, relative (negative: rose)."
    )
    final_losses: list[float | None] = Field(description="Each seed's final held-out loss.")
    metric: float | None = Field(
        None,
        description="Where the model's factory gives a referee: its metric on the factory's held-out set "
        "at the end, the mean over seeds; else null.",
    )


class ProbeRuleOut(BaseModel):
    rule: str = Field(examples=["linear"])
    lr: float = Field(description="The lr this rule gives the plan's global batch.")
    curve: list[LossPointOut] = Field(description="The first seed's.")
    final_loss_ratio: float | None = Field(
        description="Its final held-out loss over the same seed's base run's, the mean over seeds; "
        "null when a seed diverged."
    )
    holds: bool = Field(description="outcome is holds: every seed within the tolerance.")
    last_interval_fall: float | None = Field(
        description="How far its held-out loss fell over the last interval, relative (negative: rose)."
    )
    still_falling: bool = Field(
        description="A seed fell faster than its base run over the last interval by more than half the "
        "tolerance: its outcome was not settled when the probe stopped."
    )
    seed_ratios: list[float | None] = Field(
        description="Each seed's final loss over its base run's; where the factory's metric judges "
        "(metric_name), its metric over its base run's."
    )
    ratio_spread: float | None = Field(
        description="The seeds' standard deviation of that ratio (0 with one seed; null when one diverged)."
    )
    outcome: Literal["holds", "fails", "borderline"] = Field(
        description="holds: every seed within the tolerance; fails: none; borderline: seeds on both sides "
        "(by the factory's metric where it gives one)."
    )
    metric: float | None = Field(
        None,
        description="Where the factory gives a referee: its metric on the factory's held-out set at the "
        "end, the mean over seeds; else null.",
    )
    metric_ratio: float | None = Field(
        None, description="The mean of seed_ratios where the factory's metric judges; else null."
    )


class ProbeNoiseOut(BaseModel):
    start: float | None = Field(description="B_simple at the initial weights; null: not measurable.")
    middle: float | None = Field(description="B_simple halfway through the base run; null: not measurable.")
    end: float | None = Field(description="B_simple after the base run; null: not measurable.")
    used: Literal["start", "middle", "end"] | None = Field(
        description="The one the regime and the prediction are read from: middle (where the run spends "
        "its steps; the noise scale grows as the loss falls), else end, else start."
    )
    batch_to_noise: float | None = Field(description="The global batch over the B_noise used.")
    linear_overshoot: float | None = Field(
        description="McCandlish et al. 2018: how far linear scaling from the base batch overshoots the "
        "best lr, (B + B_noise) / (b + B_noise)."
    )
    unmeasured: list[str] = Field(
        default_factory=list,
        description="Why a value above is null, one line each (`end: the mean gradient is within its own "
        "noise ...`: near a minimum the estimate of |G|^2 falls to 0 or below).",
        examples=[
            ["end: the mean gradient is within its own noise (2,048 samples estimate |G|^2 at or below 0)"]
        ],
    )


class LrScalingOut(BaseModel):
    """An lr-scaling probe's answer (docs/lr-scaling.md); give it back to a plan as
    learning_rate.lr_scaling (rule "measured")."""

    samples: int = Field(description="Samples every run trained: a whole number of global batches.")
    global_batch_size: int
    length: Literal["samples", "epochs", "whole_run"] = Field(
        description="Where samples came from: lr_scaling.samples, lr_scaling.epochs, or the plan's whole run."
    )
    tolerance: float = Field(description="How far above the base run's final loss a rule may end and hold.")
    tolerance_unit: Literal["relative", "nats"]
    seeds: int = Field(description="Initialisations and sample streams each run was trained from.")
    label_noise: float = Field(description="The built-in model's target noise the probe trained with.")
    base: ProbeBaseOut
    rules: list[ProbeRuleOut]
    best_rule: str = Field(
        description="The rule with the lowest mean final_loss_ratio (with a factory's metric: the best "
        "metric_ratio)."
    )
    tied_for_best: list[str] = Field(
        description="best_rule and every rule it does not beat in every seed: only best_rule where it is "
        "best beyond the seeds' spread."
    )
    plan_rule: str = Field(description="The rule the plan scales by.")
    plan_rule_holds: bool
    noise_scale: ProbeNoiseOut
    regime: Literal["below_noise_scale", "around_noise_scale", "above_noise_scale", "unknown"] = Field(
        description="The global batch against B_noise: below a quarter of it (linear should hold), "
        "above four times it (linear should not), or around it."
    )
    could_change: list[str] = Field(
        description="Rules still falling when the probe stopped whose outcome a longer probe could "
        "change (empty at the plan's whole run: real training stops there too)."
    )
    settling_samples: int | None = Field(
        description="The length that would settle them: as many steps at the global batch as the base "
        "run took here, at most the plan's whole run; null when nothing is unsettled."
    )
    prediction_agrees: bool | None = Field(
        description="Whether McCandlish et al.'s prediction for linear (holds under an overshoot of 1.5, "
        "overshoots from 2) matches linear's measured outcome; null where either says nothing clear. "
        "The verdict names the likely cause when they disagree."
    )
    verdict: str
    metric_name: str | None = Field(
        None,
        description="The metric that judged: a factory's referee (its held-out set and metric, "
        "docs/your-own-model.md), the held-out loss beside it; null: judged by the held-out loss.",
        examples=["accuracy"],
    )
    higher_is_better: bool | None = Field(
        None,
        description="The metric's direction (a rule holds within the tolerance below the base run's "
        "where higher is better); null without a metric.",
    )


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
