"""A check of several optimizer steps (`steps` above 1) over HTTP: what it adds to the result
(the run's trajectory against the reference run, how its epochs ended, and each run-level
control's run; app.contract.kinds.run writes them), laid out in the result's own object, and
its Swagger example."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field


class TrajectoryStepOut(BaseModel):
    step: int = Field(description="Optimizer step, from 0.")
    epoch: int = Field(description="The epoch it read from (its sampler's set_epoch).")
    lr: float = Field(description="The learning rate it stepped with (the recipe's lr_of the step).")
    loss: float = Field(
        description="The run's loss over the step's global batch, weighted as the plan says "
        "(all-reduced over the replicas), before the step."
    )
    reference_loss: float = Field(description="The single-process reference run's, on its own weights.")
    params_rel_l2: float = Field(
        description="Relative L2 distance of the run's parameters after the step from the reference's."
    )
    valid_tokens: int | None = Field(
        description="The step's valid tokens over every micro-batch and replica (loss_normalization "
        "token), all-reduced as torchtitan counts them; null for sample plans."
    )
    within_tolerance: bool = Field(
        description="params_rel_l2, and the loss's relative difference, within run_tolerance."
    )


class ControlStepOut(BaseModel):
    step: int
    lr: float = Field(description="The lr the mistake stepped with.")
    loss: float
    params_rel_l2: float = Field(description="Its parameters after the step against the reference's.")


class EpochEndOut(BaseModel):
    """How the run's epochs ended: what it did with an epoch's leftover micro-batches."""

    optimizer_steps_per_epoch: int
    epochs_run: int = Field(description="Epochs the run's steps touched.")
    leftover: Literal["dropped"] = Field(
        description="The micro-batches after an epoch's last whole optimizer step (the plan's "
        "sampler.leftover): dropped, and the next epoch starts a new step."
    )
    leftover_micro_steps: int = Field(description="Micro-steps dropped at the end of each epoch.")
    short_micro_batch_samples: int | None = Field(
        description="Samples in each replica's last micro-batch of an epoch when it is short (an even "
        "split whose shard is not a multiple of the micro-batch) and a step reads it: weighted as the "
        "plan says, its mean times the replica's loss scale. null: no step reads a short one.",
        examples=[2],
    )


# CheckResultOut's fields of a run, one line each there: the codec lays a RunOutcome out in the
# result's own object (FLAT), each key null for a one-step check.
Trajectory = Annotated[
    list[TrajectoryStepOut] | None,
    Field(
        description="With steps above 1: every optimizer step of the plan's run beside the single-process "
        "reference run's (GET /v1/checks/{id}/trajectory.png draws it).",
    ),
]
FinalParamsRelL2 = Annotated[
    float | None,
    Field(description="params_rel_l2 after the last step: where the run's parameters end up."),
]
TrajectoryMatches = Annotated[
    bool | None, Field(description="Every step of the run within run_tolerance (passed requires it).")
]
RunTolerance = Annotated[
    float | None,
    Field(
        description="Per step, on params_rel_l2 and on the loss's relative difference: 1e-12 in float64 "
        "(a step's round-off, carried over the run), 1e-5 in float32.",
    ),
]
ControlTrajectories = Annotated[
    dict[str, list[ControlStepOut]] | None,
    Field(
        description="Each run-level control that ran, by name: the mistake's run step by step, drawn "
        "beside the plan's in the trajectory chart. Its verdict is in `controls` (rel_l2 there: its "
        "parameters against the reference's after the last step).",
    ),
]


def two_epoch_plan(**body: Any) -> dict[str, Any]:
    """The plan the run and resume examples train 20 steps of: 10 steps an epoch on 4 replicas."""
    return {
        "topology": {"num_nodes": 1, "gpus_per_node": 4},
        "global_batch_size": 32,
        "micro_batch_size": 4,
        "dataset": {"num_samples": 320, "shuffle": True, "seed": 0},
        **body,
    }


EXAMPLES: dict[str, dict[str, Any]] = {
    "run": {
        "summary": "A run, not one step: 20 optimizer steps of a recipe over two epochs",
        "description": "The ranks train the plan's recipe (warmup, cosine decay, weight decay, clipping) "
        "through its sampler across an epoch boundary; every step is held against a single-process "
        "reference run, beside the run-level controls. The result's `trajectory` lists the steps; "
        "GET /v1/checks/{id}/trajectory.png draws them.",
        "value": {
            "plan": two_epoch_plan(
                learning_rate={
                    "base_lr": 0.1,
                    "rule": "none",
                    "warmup_steps": 4,
                    "warmup_start_lr": 0.0,
                    "decay": "cosine",
                    "train_steps": 20,
                    "weight_decay": 0.01,
                    "max_grad_norm": 0.5,
                },
            ),
            "steps": 20,
        },
    },
}
