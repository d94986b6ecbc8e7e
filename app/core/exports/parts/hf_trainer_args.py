"""The hf-trainer export's `TrainingArguments`: every field of the plan's recipe the Trainer can
express, set to the plan's values, and what a plain `Trainer(args=training_args)` (without the
export's PlanTrainer) still gets wrong, one sentence each, for the export's header
(tests/core/test_exports_plain_trainer.py trains a plain Trainer on them and holds the two).

As transformers 5.24 reads them:

- the optimizer: `optim="sgd"` with `optim_args` "momentum=...,nesterov=..." (torch.optim.SGD),
  or `optim="adamw_torch"` (torch.optim.AdamW, not the fused default) with `adam_beta1`,
  `adam_beta2`, `adam_epsilon`; `weight_decay`. The Trainer puts biases and norm weights in a
  group without weight decay, and has no torch.optim.Adam: AdamW without weight decay is Adam
  (torch's AdamW decays after the Adam step, and only that), with it the decay is decoupled.
- the lr: `lr_scheduler_type`, `warmup_steps`, `lr_scheduler_kwargs`, with `max_steps` the
  run's length (the Trainer's num_training_steps). `warmup_stable_decay` warms up linearly from
  `min_lr_ratio` x peak to the peak over W steps, holds, then decays to that same ratio over
  `num_decay_steps`: with no stable steps and L - W decay steps it is the plan's linear or
  cosine decay reaching min_lr at the last step L, its warmup the plan's where it starts at
  min_lr (or there is none); with no decay steps it is a warmup to a constant lr from any
  start. `cosine_warmup_with_min_lr` warms up from `warmup_lr_rate` and reaches the peak one
  step before its warmup_steps, then decays by cosine to `min_lr_rate` at num_training_steps -
  1: with warmup_steps W + 1 it is the plan's cosine schedule from any start to any floor.
  Nothing in the Trainer multiplies the lr at milestones (step decay).
"""

from __future__ import annotations

from typing import Any

from app.core.exports.parts.export_types import ExportInput
from app.core.exports.parts.recipe_code import recipe
from app.core.exports.parts.training import leftover_micro_batches
from app.core.records.plan import LearningRatePlan


def optimizer_arguments(x: ExportInput) -> tuple[dict[str, Any], list[str]]:
    """(TrainingArguments' optimizer fields, what a plain Trainer's optimizer gets wrong)."""
    _, o = recipe(x)
    values: dict[str, Any]
    if o.momentum is not None:  # sgd, and lars's stand-in
        values = {"optim": "sgd", "optim_args": f"momentum={o.momentum!r},nesterov={o.nesterov}"}
    else:
        assert o.betas is not None and o.eps is not None
        values = {
            "optim": "adamw_torch",
            "adam_beta1": o.betas[0],
            "adam_beta2": o.betas[1],
            "adam_epsilon": o.eps,
        }
    values["weight_decay"] = o.weight_decay
    wrong = []
    if o.weight_decay:
        wrong.append(
            "it does not decay biases and norm weights (its second parameter group); the plan decays "
            "every parameter"
        )
    if o.name == "adam" and o.weight_decay:
        wrong.append(
            f"its AdamW decouples the weight decay {o.weight_decay!r} from the gradient, where the plan's "
            "adam (torch.optim.Adam) adds it to the gradient"
        )
    return values, wrong


def _wsd(lr: LearningRatePlan, ratio: float, decay: str, decay_steps: int) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"min_lr_ratio": ratio, "warmup_type": "linear", "num_decay_steps": decay_steps}
    if decay_steps:
        # No stable phase: the decay starts at the warmup's end and ends at the last step
        # (transformers warns that num_stable_steps wins over num_training_steps, as meant here).
        kwargs |= {"num_stable_steps": 0, "decay_type": decay}
    return {
        "lr_scheduler_type": "warmup_stable_decay",
        "warmup_steps": lr.warmup_steps,
        "lr_scheduler_kwargs": kwargs,
    }


def schedule_arguments(lr: LearningRatePlan) -> tuple[dict[str, Any], list[str]]:
    """(TrainingArguments' lr schedule fields, what a plain Trainer's lr gets wrong)."""
    s, p, warmup, f = lr.warmup_start_lr, lr.lr, lr.warmup_steps, lr.min_lr
    last = lr.train_steps - 1 if lr.train_steps else None
    decay = lr.decay
    if decay in ("linear", "cosine") and (last is None or last <= warmup):
        decay = "constant"  # the run ends before any decay
    wrong = []
    if decay == "step":
        wrong.append(
            f"it has no step decay: the lr stays {p!r} after the warmup, where the plan multiplies it by "
            f"{lr.gamma!r} at steps {', '.join(map(str, lr.milestones))}"
        )
        decay = "constant"
    if decay == "constant":
        if not warmup:
            return {"lr_scheduler_type": "constant"}, wrong
        return _wsd(lr, s / p, "linear", 0), wrong
    assert last is not None
    if decay == "cosine":
        return {
            "lr_scheduler_type": "cosine_warmup_with_min_lr",
            # Its warmup reaches the peak at warmup_steps - 1: W + 1 is the plan's W (1: none).
            "warmup_steps": warmup + 1,
            "lr_scheduler_kwargs": {"min_lr_rate": f / p, "warmup_lr_rate": s / p if warmup else 1.0},
        }, wrong
    if warmup and s != f:
        wrong.append(
            f"its lr warms up from {f!r}, not {s!r}: warmup_stable_decay starts at the min_lr it decays "
            f"to; from step {warmup} on its lr is the plan's"
        )
    return _wsd(lr, f / p, "linear", last - warmup), wrong


def data_differences(x: ExportInput) -> list[str]:
    """What a plain Trainer reads differently from the plan, whatever its arguments."""
    p = x.plan
    out = [
        "it samples through Accelerate's own batch split, not the plan's DistributedSampler "
        f"(shuffle {p.sampler.shuffle if p.sampler else True}, seed {p.sampler.seed if p.sampler else 0})"
    ]
    leftover = leftover_micro_batches(x)
    if leftover:
        out.append(f"it steps on each epoch's {leftover} leftover micro-batches, which the plan drops")
    if p.tokens is None or p.tokens.loss_normalization != "token":
        out.append(
            "a model whose forward takes **kwargs gets num_items_in_batch and normalises the loss by the "
            "step's label count, where the plan weighs every sample alike"
        )
    return out
