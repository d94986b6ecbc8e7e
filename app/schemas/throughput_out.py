"""The plan's `throughput` in the answer of POST /v1/plans (ThroughputOut): a split from measured
throughput curves, timed, beside the splits it was chosen over (app.core.split.throughput_plan)."""

from __future__ import annotations

from pydantic import Field

from app.schemas.types import ResponseModel, with_examples


class SplitPredictionOut(ResponseModel):
    gradient_accumulation_steps: int
    predicted_step_s: float = Field(
        description="gradient_accumulation_steps x predicted_micro_step_s: an optimizer step's compute."
    )
    predicted_micro_step_s: float = Field(description="The slowest replica's micro-step, in seconds.")
    idle_fraction: float = Field(
        description="The replicas' mean wait for the slowest, as a fraction of the step (0: none waits)."
    )


class ThroughputOut(ResponseModel):
    model_config = with_examples(
        {
            "predicted_step_s": 0.1183,
            "predicted_micro_step_s": 0.0592,
            "idle_fraction": 0.0084,
            "even": {
                "gradient_accumulation_steps": 2,
                "predicted_step_s": 0.2,
                "predicted_micro_step_s": 0.1,
                "idle_fraction": 0.3236,
            },
            "proportional": {
                "gradient_accumulation_steps": 2,
                "predicted_step_s": 0.1342,
                "predicted_micro_step_s": 0.0671,
                "idle_fraction": 0.112,
            },
            "fewest_accumulation": {
                "gradient_accumulation_steps": 1,
                "predicted_step_s": 0.1412,
                "predicted_micro_step_s": 0.1412,
                "idle_fraction": 0.021,
            },
            "extrapolated": False,
        }
    )

    predicted_step_s: float = Field(description="The plan's optimizer step, predicted from the curves.")
    predicted_micro_step_s: float = Field(description="The plan's slowest replica's micro-step.")
    idle_fraction: float = Field(description="The replicas' mean wait for the slowest, as a fraction.")
    even: SplitPredictionOut = Field(
        description="The same samples per micro-step shared out equally (as even as the caps allow)."
    )
    proportional: SplitPredictionOut = Field(
        description="The same samples shared out in proportion to each curve's peak samples/s: the "
        "best one relative_throughput per group can say."
    )
    fewest_accumulation: SplitPredictionOut = Field(
        description="The best split at the fewest accumulation steps that fit (the largest "
        "micro-batches): the plan without curves would take that count. The plan's own when the "
        "request fixed the accumulation or the micro-batch."
    )
    extrapolated: bool = Field(
        description="Some replica's micro-batch lies outside its measured points (a warning says which)."
    )
