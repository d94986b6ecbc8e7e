"""The training recipe of a plan: the run's length, the lr's warmup and decay, and the
optimizer's settings (momentum, nesterov, weight decay, clipping), resolved from the request's
`learning_rate` object and checked, each refusal naming its field.

The lr at every step is `app.core.learning_rate.lr_schedule.lr_at` of the resolved `LearningRatePlan`
(`lr_of`); everything that shows or writes a schedule calls it.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, Decimal, localcontext
from typing import Any

from app.core.errors.domain import InvalidValue
from app.core.learning_rate.recipe_summary import summary
from app.core.records.plan_request import Decay, LearningRateSpec, Optimizer

# SGD's momentum when the request names none: Goyal et al.'s ImageNet recipe, and what every
# export wrote before the plan had a momentum of its own.
DEFAULT_MOMENTUM = 0.9
SGD_LIKE = frozenset({Optimizer.SGD, Optimizer.LARS})
_LR = "/learning_rate/"


def epochs_to_steps(epochs: float, optimizer_steps_per_epoch: int) -> int:
    """ceil(epochs x steps per epoch), on the decimal the user wrote: 1.1 epochs of 50 steps
    is 55, where binary floats give 55.00000000000001 and would round up to 56."""
    if type(epochs) is int or (isinstance(epochs, float) and epochs.is_integer() and epochs < 2**53):
        # Whole epochs, the usual case: below 2**53 a float is the integer written.
        return int(epochs) * optimizer_steps_per_epoch
    with localcontext(prec=64):
        steps = Decimal(repr(epochs)) * optimizer_steps_per_epoch
        return int(steps.to_integral_value(rounding=ROUND_CEILING))


def run_length(
    spec: LearningRateSpec,
    global_batch: int,
    steps_per_epoch: int | None,
    epochs: int | None,
    warmup: int = 0,
) -> tuple[int | None, list[str]]:
    """The run's optimizer steps: train_steps, or train_samples // the global batch (as
    Megatron's --train-samples), or dataset.epochs x steps per epoch; None when unknown. A run
    too short for one step past the warmup is refused here, with the shortest that is not."""
    if spec.train_steps is not None and spec.train_samples is not None:
        raise InvalidValue("give train_steps or train_samples, not both", pointer=_LR + "train_samples")
    available = steps_per_epoch * epochs if steps_per_epoch is not None and epochs is not None else None
    warnings: list[str] = []
    if spec.train_steps is not None:
        steps, field = spec.train_steps, "train_steps"
    elif spec.train_samples is not None:
        steps, field = spec.train_samples // global_batch, "train_samples"
        if steps <= warmup:
            raise InvalidValue(
                f"train_samples {spec.train_samples} make {steps} optimizer steps of {global_batch} "
                f"samples; the run needs one past its warmup of {warmup} steps",
                pointer=_LR + field,
                suggestions={field: [(warmup + 1) * global_batch]},
            )
        if spec.train_samples % global_batch:
            warnings.append(
                f"train_samples {spec.train_samples} is not a multiple of the global batch {global_batch}: "
                f"the run takes {steps} optimizer steps ({steps * global_batch} samples), as Megatron's "
                f"--train-samples does"
            )
    else:
        return available, warnings
    if available is not None and steps > available:
        unit = 1 if field == "train_steps" else global_batch
        raise InvalidValue(
            f"a run of {steps} optimizer steps is longer than dataset.epochs {epochs} x "
            f"{steps_per_epoch} optimizer steps per epoch = {available}: raise dataset.epochs or "
            f"shorten the run",
            pointer=_LR + field,
            suggestions={field: [available * unit]} if available else {},
        )
    return steps, warnings


def _milestones(
    spec: LearningRateSpec, warmup: int, steps: int | None, steps_per_epoch: int | None
) -> tuple[int, ...]:
    if spec.milestones is not None and spec.milestone_epochs is not None:
        raise InvalidValue("give milestones or milestone_epochs, not both", pointer=_LR + "milestone_epochs")
    field, given = ("milestones", spec.milestones)
    if spec.milestone_epochs is not None:
        field = "milestone_epochs"
        if steps_per_epoch is None:
            raise InvalidValue(
                "milestone_epochs needs a dataset to count optimizer steps per epoch; add "
                "dataset.num_samples or give milestones in optimizer steps",
                pointer=_LR + field,
            )
        given = tuple(epochs_to_steps(e, steps_per_epoch) for e in spec.milestone_epochs)
    if not given:
        raise InvalidValue(
            "step decay needs milestones (optimizer steps) or milestone_epochs: where the lr is "
            "multiplied by gamma",
            pointer=_LR + "milestones",
        )
    for i, m in enumerate(given):
        pointer = f"{_LR}{field}/{i}"
        if i and m <= given[i - 1]:
            raise InvalidValue(
                f"milestones must increase: step {m} is not after step {given[i - 1]}", pointer=pointer
            )
        if m <= warmup:
            raise InvalidValue(
                f"milestone at optimizer step {m} is not after the warmup, which ends at step {warmup}",
                pointer=pointer,
            )
        if steps is not None and m >= steps:
            raise InvalidValue(
                f"milestone at optimizer step {m} is past the run's last step {steps - 1}: it never applies",
                pointer=pointer,
            )
    return tuple(given)


def _check_warmup(
    spec: LearningRateSpec, warmup: int, steps: int | None, steps_per_epoch: int | None
) -> None:
    if steps is None or steps == 0 or warmup < steps:
        return
    in_epochs = spec.warmup_epochs is not None
    suggestions: dict[str, list[int]] = {}
    if in_epochs and steps_per_epoch:
        whole = (steps - 1) // steps_per_epoch
        suggestions = {"warmup_epochs": [whole]} if whole >= 1 else {}
    elif not in_epochs and steps > 1:
        suggestions = {"warmup_steps": [steps - 1]}
    raise InvalidValue(
        f"the warmup of {warmup} optimizer steps must end before the run's last step: the run has "
        f"{steps} optimizer steps",
        pointer=_LR + ("warmup_epochs" if in_epochs else "warmup_steps"),
        suggestions=suggestions,
    )


def _optimizer_settings(spec: LearningRateSpec) -> float | None:
    """SGD's momentum (None for Adam-like optimizers), after the checks every optimizer shares."""
    sgd_like = spec.optimizer in SGD_LIKE
    if spec.momentum is not None and not sgd_like:
        raise InvalidValue(
            f"momentum is SGD's and LARS's; {spec.optimizer.value}'s momentum is betas[0]",
            pointer=_LR + "momentum",
        )
    momentum = (DEFAULT_MOMENTUM if spec.momentum is None else spec.momentum) if sgd_like else None
    if momentum is not None and not (math.isfinite(momentum) and 0 <= momentum < 1):
        raise InvalidValue("momentum must lie in [0, 1)", pointer=_LR + "momentum")
    if spec.nesterov and not momentum:
        raise InvalidValue(
            "nesterov needs SGD (or LARS) with momentum > 0"
            + ("" if sgd_like else f", not {spec.optimizer.value}"),
            pointer=_LR + "nesterov",
        )
    if not (math.isfinite(spec.weight_decay) and 0 <= spec.weight_decay <= 1):
        raise InvalidValue("weight_decay must lie in [0, 1]", pointer=_LR + "weight_decay")
    clip = spec.max_grad_norm
    if clip is not None and not (math.isfinite(clip) and clip > 0):
        raise InvalidValue(
            "max_grad_norm must be finite and > 0 (leave it out for no clipping)",
            pointer=_LR + "max_grad_norm",
        )
    return momentum


def complete(
    spec: LearningRateSpec,
    *,
    lr: float,
    warmup_steps: int,
    rule: str,
    global_batch: int,
    steps_per_epoch: int | None,
    epochs: int | None,
) -> tuple[dict[str, Any], list[str]]:
    """The rest of the recipe for a scaled `lr` and its warmup, as LearningRatePlan's fields,
    and the recipe's warnings. Fields, not a plan: the caller builds the plan once, where a
    plan and two `dataclasses.replace` of its 26 fields cost a sixth of a whole request
    (bench/bench_instructions.py)."""
    steps, warnings = run_length(spec, global_batch, steps_per_epoch, epochs, warmup_steps)
    momentum = _optimizer_settings(spec)
    decay = spec.decay or Decay.CONSTANT
    assert spec.base_lr is not None  # plan_learning_rate refused it missing
    start = spec.base_lr if spec.warmup_start_lr is None else spec.warmup_start_lr
    if spec.warmup_start_lr is not None and not (math.isfinite(start) and 0 <= start <= lr):
        raise InvalidValue(
            f"warmup_start_lr must be from 0 to the peak learning rate {lr!r}",
            pointer=_LR + "warmup_start_lr",
        )
    floor = 0.0 if spec.min_lr is None else spec.min_lr
    if not (math.isfinite(floor) and 0 <= floor <= lr):
        raise InvalidValue(f"min_lr must be from 0 to the peak learning rate {lr!r}", pointer=_LR + "min_lr")
    if decay in (Decay.COSINE, Decay.LINEAR) and steps is None:
        raise InvalidValue(
            f"{decay.value} decay ends at the run's last step: give learning_rate.train_steps or "
            f"train_samples, or dataset.epochs",
            pointer=_LR + "decay",
        )
    if not (math.isfinite(spec.gamma) and 0 < spec.gamma < 1):
        raise InvalidValue("gamma must lie in (0, 1)", pointer=_LR + "gamma")
    _check_warmup(spec, warmup_steps, steps, steps_per_epoch)
    milestones: tuple[int, ...] = ()
    if decay is Decay.STEP:
        milestones = _milestones(spec, warmup_steps, steps, steps_per_epoch)
    elif spec.milestones is not None or spec.milestone_epochs is not None:
        field = "milestones" if spec.milestones is not None else "milestone_epochs"
        raise InvalidValue(f"{field} are for decay step, not {decay.value}", pointer=_LR + field)
    warnings += _no_effect(spec, lr, warmup_steps, rule, decay, start)
    gamma = spec.gamma if decay is Decay.STEP else None
    fields = {
        "warmup_start_lr": start,
        "decay": str(decay),
        "min_lr": floor,
        "milestones": milestones,
        "gamma": gamma,
        "train_steps": steps,
        "momentum": momentum,
        "nesterov": spec.nesterov,
        "weight_decay": spec.weight_decay,
        "max_grad_norm": spec.max_grad_norm,
    }
    fields.update(summary(start, lr, warmup_steps, str(decay), floor, steps, milestones, gamma))
    return fields, warnings


def _no_effect(
    spec: LearningRateSpec, lr: float, warmup_steps: int, rule: str, decay: Decay, start: float
) -> list[str]:
    out = []
    if warmup_steps and start == lr:
        source = "base_lr" if spec.warmup_start_lr is None else "warmup_start_lr"
        out.append(
            f"the warmup changes nothing: it starts at {source} {start!r}, which is already the lr "
            f"(rule {rule}); set learning_rate.warmup_start_lr (0, or a fraction of the lr) for "
            f"a real warmup, or leave the warmup out"
        )
    if spec.warmup_start_lr is not None and not warmup_steps:
        out.append("warmup_start_lr has no effect without warmup_steps or warmup_epochs")
    return out + min_lr_unused(spec.min_lr or 0.0, decay.value)


def min_lr_unused(min_lr: float, decay: str) -> list[str]:
    """The warning for a floor the decay never reaches (the plan's, or a schedule's own decay)."""
    if min_lr and decay not in (Decay.COSINE, Decay.LINEAR):
        return [f"min_lr has no effect with decay {decay}: only cosine and linear decay end there"]
    return []
