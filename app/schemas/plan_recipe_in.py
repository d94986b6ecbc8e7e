"""The training recipe in the body of POST /v1/plans (LearningRateIn, the request's
`learning_rate`; the elastic export takes the same), as validated and documented."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from app.core.records import plan_request as core
from app.schemas.lr_scaling_in import LrScalingIn
from app.schemas.types import RequestModel, plan_limit, with_examples

Beta = Annotated[float, plan_limit("learning_rate.betas[]")]
Milestone = Annotated[int, plan_limit("learning_rate.milestones[]")]
MilestoneEpoch = Annotated[float, plan_limit("learning_rate.milestone_epochs[]")]
Milestones = Annotated[list[Milestone], plan_limit("learning_rate.milestones")]
MilestoneEpochs = Annotated[list[MilestoneEpoch], plan_limit("learning_rate.milestone_epochs")]


class LearningRateIn(RequestModel):
    """The training recipe: the lr's scaling, warmup and decay, the run's length, and the
    optimizer's settings. Every export writes all of it in its tool's terms."""

    model_config = with_examples(
        {
            "base_lr": 0.1,
            "base_batch_size": 256,
            "rule": "linear",
            "optimizer": "sgd",
            "warmup_epochs": 5,
        },
        {
            "base_lr": 0.1,
            "base_batch_size": 256,
            "rule": "linear",
            "optimizer": "sgd",
            "warmup_epochs": 5,
            "decay": "step",
            "milestone_epochs": [30, 60, 80],
            "momentum": 0.9,
            "weight_decay": 0.0001,
        },
        {
            "base_lr": 0.0003,
            "base_batch_size": 256,
            "optimizer": "adamw",
            "warmup_steps": 2000,
            "warmup_start_lr": 0.0,
            "decay": "cosine",
            "min_lr": 0.00003,
            "train_steps": 100000,
            "weight_decay": 0.1,
            "max_grad_norm": 1.0,
        },
    )

    base_lr: Annotated[float, plan_limit("learning_rate.base_lr")] | None = Field(
        None,
        description="The peak lr tuned at base_batch_size (or base_batch_tokens). Required, except beside "
        "recommend, whose law then gives it at the law's batch (rule auto then means none).",
        examples=[0.1],
    )
    base_batch_size: Annotated[int, plan_limit("learning_rate.base_batch_size")] = 256
    rule: core.LRRule = Field(
        core.LRRule.AUTO,
        description="linear (Goyal et al.), sqrt (Krizhevsky; Malladi et al. for Adam), none, auto "
        "(linear for sgd/lars, sqrt for adam-like), or measured: the best rule of an lr-scaling probe "
        "(`POST /v1/checks` with `lr_scaling`), given as lr_scaling_check or lr_scaling.",
    )
    optimizer: core.Optimizer = core.Optimizer.SGD
    warmup_epochs: Annotated[float, plan_limit("learning_rate.warmup_epochs")] | None = None
    warmup_steps: Annotated[int, plan_limit("learning_rate.warmup_steps")] | None = None
    betas: tuple[Beta, Beta] = (0.9, 0.999)  # two items, as learning_rate.betas in the table says
    eps: Annotated[float, plan_limit("learning_rate.eps")] = 1e-8
    base_batch_tokens: Annotated[int, plan_limit("learning_rate.base_batch_tokens")] | None = Field(
        None,
        description="Scale against tokens per optimizer step instead of samples: the factor is "
        "applied to (global batch x sequence_length) / base_batch_tokens. Needs sequence_length; "
        "base_batch_size is then not used.",
        examples=[1048576],
    )
    warmup_start_lr: Annotated[float, plan_limit("learning_rate.warmup_start_lr")] | None = Field(
        None,
        description="Where the linear warmup starts (step 0); it reaches the scaled lr at step "
        "warmup_steps. Default: base_lr (Goyal et al.). 0 is allowed; at most the scaled lr.",
        examples=[0.0],
    )
    decay: core.Decay | None = Field(
        None,
        description="After warmup: constant (the default), cosine or linear to min_lr at the run's "
        "last step, or step (x gamma at each milestone).",
        examples=["cosine"],
    )
    min_lr: Annotated[float, plan_limit("learning_rate.min_lr")] | None = Field(
        None,
        description="The lr at the run's last step under cosine and linear decay; default 0, at "
        "most the scaled lr.",
        examples=[0.00003],
    )
    milestones: Milestones | None = Field(
        None,
        description="Step decay: the optimizer steps at which the lr is multiplied by gamma, "
        "increasing, after the warmup and before the run's end.",
        examples=[[30000, 60000, 80000]],
    )
    milestone_epochs: MilestoneEpochs | None = Field(
        None,
        description="Step decay's milestones in epochs instead (ceil(epochs x optimizer steps per "
        "epoch); needs dataset).",
        examples=[[30, 60, 80]],
    )
    gamma: Annotated[float, plan_limit("learning_rate.gamma")] = Field(
        0.1,
        description="Step decay's factor at each milestone.",
        examples=[0.1],
    )
    train_steps: Annotated[int, plan_limit("learning_rate.train_steps")] | None = Field(
        None,
        description="The run's optimizer steps; default dataset.epochs x optimizer_steps_per_epoch. "
        "With dataset.epochs, at most that.",
        examples=[100000],
    )
    train_samples: Annotated[int, plan_limit("learning_rate.train_samples")] | None = Field(
        None,
        description="The run's length in samples instead: train_samples // global batch steps, as "
        "Megatron's --train-samples.",
        examples=[51200000],
    )
    momentum: Annotated[float, plan_limit("learning_rate.momentum")] | None = Field(
        None,
        description="SGD's (and LARS's) momentum; default 0.9. Adam-like optimizers use betas.",
        examples=[0.9],
    )
    nesterov: bool = Field(
        False, strict=True, description="Nesterov momentum (SGD with momentum > 0).", examples=[True]
    )
    weight_decay: Annotated[float, plan_limit("learning_rate.weight_decay")] = Field(
        0.0,
        description="As torch's optimizers apply it, to every parameter: L2 in the gradient for "
        "sgd, lars and adam, decoupled for adamw and lamb.",
        examples=[0.1],
    )
    max_grad_norm: Annotated[float, plan_limit("learning_rate.max_grad_norm")] | None = Field(
        None,
        description="Clip the all-reduced gradient to this global L2 norm (torch's "
        "clip_grad_norm_) before each optimizer step; default none: no clipping.",
        examples=[1.0],
    )
    lr_scaling: LrScalingIn | None = Field(
        None,
        description="With rule \"measured\": an lr-scaling probe's result (its check's result.lr_scaling, "
        "as it is); the plan scales by its best_rule. Its base must be this plan's base_lr and "
        "base_batch_size.",
    )
    lr_scaling_check: (
        Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")] | None
    ) = Field(
        None,
        description='With rule "measured": the id of a finished lr-scaling probe on this server '
        "(`POST /v1/checks` with `lr_scaling`), instead of lr_scaling; the plan names it.",
        examples=["4f9c2b7e0d1a4c6b8e3f5a7c9d2e1b0a"],
    )
