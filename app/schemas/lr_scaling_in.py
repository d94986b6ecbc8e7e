"""An lr-scaling probe's result as a plan request takes it back (`learning_rate.lr_scaling`,
under `rule: "measured"`): the object `POST /v1/checks` with `lr_scaling` answers, as it is.

Its models ignore keys they do not name, unlike the rest of the request: the object is the
probe's own answer, passed back whole, and a newer probe may say more than this plan reads."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from app.schemas.examples import lr_scaling_result
from app.schemas.types import plan_limit, with_examples

_PROBE = "learning_rate.lr_scaling."


class _ProbePart(BaseModel):
    model_config = ConfigDict(extra="ignore")


class LossPointIn(_ProbePart):
    samples: int
    loss: float | None = Field(description="The held-out loss; null once the run diverged.")


class ProbeBaseIn(_ProbePart):
    batch_size: Annotated[int, plan_limit(_PROBE + "base.batch_size")] = Field(
        description="The base run's batch (the plan's base_batch_size)."
    )
    lr: Annotated[float, plan_limit(_PROBE + "base.lr")] = Field(
        description="The base run's lr (the plan's base_lr)."
    )
    curve: Annotated[list[LossPointIn], plan_limit(_PROBE + "base.curve")] | None = None


class ProbeRunIn(_ProbePart):
    rule: str = Field(min_length=1, max_length=32, examples=["linear"])
    lr: Annotated[float, plan_limit(_PROBE + "rules[].lr")] | None = Field(
        None, description="The lr this rule gave the plan's global batch."
    )
    curve: Annotated[list[LossPointIn], plan_limit(_PROBE + "rules[].curve")] | None = None
    final_loss_ratio: Annotated[float, plan_limit(_PROBE + "rules[].final_loss_ratio")] | None = Field(
        None, description="Its final held-out loss over the base run's."
    )
    holds: bool | None = Field(None, description="It stayed within the probe's tolerance of the base run.")


class NoiseScaleIn(_ProbePart):
    start: float | None = None
    end: float | None = None


class LrScalingIn(_ProbePart):
    """The probe's result (`result.lr_scaling` of its check): the plan reads best_rule, each
    rule's run and the base; the rest is kept for what the probe says."""

    model_config = with_examples(lr_scaling_result())

    base: ProbeBaseIn | None = None
    rules: Annotated[list[ProbeRunIn], plan_limit(_PROBE + "rules")] = Field(default_factory=list)
    best_rule: str | None = Field(
        description="The rule whose run came closest to the base run: the plan scales by it.",
        max_length=32,
        examples=["linear"],
    )
    plan_rule_holds: bool | None = None
    noise_scale: NoiseScaleIn | None = None
    regime: str | None = Field(None, max_length=64)
    verdict: str | None = Field(None, max_length=2000)
