"""Learning-rate scaling against the global batch, with warmup.

A new rule is one function `(kappa) -> factor` and one line in `SCALING_RULES`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from app.core.errors.domain import InvalidValue
from app.core.learning_rate import recipe
from app.core.learning_rate.evidence import lr_warnings, measured_rule
from app.core.records.plan import AdamAdjustment, LearningRatePlan
from app.core.records.plan_request import LearningRateSpec, LRRule, Optimizer

# kappa = global batch / base batch
SCALING_RULES: dict[LRRule, Callable[[float], float]] = {
    LRRule.LINEAR: lambda kappa: kappa,  # Goyal et al. 2017
    LRRule.SQRT: math.sqrt,  # Krizhevsky 2014; Malladi et al. 2022 for Adam
    LRRule.NONE: lambda kappa: 1.0,
}

AUTO_RULE: dict[Optimizer, LRRule] = {
    Optimizer.SGD: LRRule.LINEAR,
    Optimizer.LARS: LRRule.LINEAR,
    Optimizer.ADAM: LRRule.SQRT,
    Optimizer.ADAMW: LRRule.SQRT,
    Optimizer.LAMB: LRRule.SQRT,
}

ADAM_LIKE = frozenset({Optimizer.ADAM, Optimizer.ADAMW, Optimizer.LAMB})


def resolve_rule(spec: LearningRateSpec) -> LRRule:
    return AUTO_RULE[spec.optimizer] if spec.rule is LRRule.AUTO else spec.rule


def warmup_steps(spec: LearningRateSpec, optimizer_steps_per_epoch: int | None) -> int:
    if spec.warmup_epochs is not None and spec.warmup_steps is not None:
        raise InvalidValue(
            "give warmup_epochs or warmup_steps, not both", pointer="/learning_rate/warmup_steps"
        )
    if spec.warmup_epochs is not None:
        if optimizer_steps_per_epoch is None:
            raise InvalidValue(
                "warmup_epochs needs a dataset to count optimizer steps per epoch; "
                "add dataset.num_samples or give warmup_steps",
                pointer="/learning_rate/warmup_epochs",
            )
        return recipe.epochs_to_steps(spec.warmup_epochs, optimizer_steps_per_epoch)
    return spec.warmup_steps or 0


def adam_adjustment(spec: LearningRateSpec, kappa: float) -> tuple[AdamAdjustment, list[str]]:
    """Malladi et al. 2022's square-root scaling rule for Adam's other constants."""
    beta1, beta2 = spec.betas
    adjusted = AdamAdjustment(
        beta1=1 - kappa * (1 - beta1),
        beta2=1 - kappa * (1 - beta2),
        eps=spec.eps / math.sqrt(kappa),
        kappa=kappa,
        valid=kappa * (1 - beta1) < 1 and kappa * (1 - beta2) < 1,
    )
    warnings = []
    if not adjusted.valid:
        warnings.append(
            f"the square-root rule for Adam holds while kappa x (1 - beta) < 1; here kappa = "
            f"{kappa:g} gives beta1 = {adjusted.beta1:g}, beta2 = {adjusted.beta2:g}, outside "
            f"[0, 1): reduce the batch growth or tune the betas by hand"
        )
    return adjusted, warnings


def _running_betas(
    spec: LearningRateSpec, adam: AdamAdjustment | None
) -> tuple[tuple[float, float] | None, float | None]:
    """The betas and eps an Adam-like optimizer runs with: the square-root rule's while they
    hold (kappa x (1 - beta) < 1), else the requested ones; none for SGD and LARS."""
    if spec.optimizer not in ADAM_LIKE:
        return None, None
    if adam is not None and adam.valid:
        return (adam.beta1, adam.beta2), adam.eps
    return spec.betas, spec.eps


def _base_lr(spec: LearningRateSpec) -> float:
    if spec.base_lr is None:  # the schema lets it out only beside recommend, which fills it in
        raise InvalidValue(
            "base_lr is required: the lr tuned at base_batch_size (or give recommend, whose law gives it)",
            pointer="/learning_rate/base_lr",
        )
    return spec.base_lr


def plan_learning_rate(
    spec: LearningRateSpec,
    global_batch_size: int,
    optimizer_steps_per_epoch: int | None,
    epochs: int | None = None,
    samples_per_step: int | None = None,
) -> tuple[LearningRatePlan, list[str]]:
    """The scaled lr and the whole recipe (app.core.learning_rate.recipe). `global_batch_size` is what kappa
    is taken against (tokens under base_batch_tokens); `samples_per_step` the global batch in
    samples, which train_samples counts in (default: `global_batch_size`)."""
    found = measured_rule(
        spec
    )  # rule "measured": an lr-scaling probe's best (app.core.learning_rate.evidence)
    rule, measured, warnings = found if found is not None else (resolve_rule(spec), None, [])
    kappa = global_batch_size / spec.base_batch_size
    factor = SCALING_RULES[rule](kappa)
    adam = None
    if spec.optimizer in ADAM_LIKE and rule is LRRule.SQRT:
        adam, adam_warnings = adam_adjustment(spec, kappa)
        warnings += adam_warnings
    if spec.optimizer in ADAM_LIKE and rule is LRRule.LINEAR and kappa > 1:
        warnings.append(
            f"linear scaling with {spec.optimizer.value} tends to diverge at large "
            f"batches; the square-root rule (rule: sqrt or auto) is the usual choice"
        )
    betas, eps = _running_betas(spec, adam)
    warmup = warmup_steps(spec, optimizer_steps_per_epoch)
    lr = _base_lr(spec) * factor
    if not math.isfinite(lr) or lr <= 0:
        raise InvalidValue(
            f"the scaled learning rate {lr!r} is not a finite positive number",
            pointer="/learning_rate/base_lr",
        )
    warnings += lr_warnings(spec, rule, factor, lr, warmup)
    recipe_fields, recipe_warnings = recipe.complete(
        spec,
        lr=lr,
        warmup_steps=warmup,
        rule=str(rule),
        global_batch=samples_per_step or global_batch_size,
        steps_per_epoch=optimizer_steps_per_epoch,
        epochs=epochs,
    )
    plan = LearningRatePlan(
        # str() of a StrEnum is its value, without `.value`'s Python-level property (0.1 us each)
        optimizer=str(spec.optimizer),
        rule=str(rule),
        requested_rule=str(spec.rule),
        base_lr=_base_lr(spec),
        base_batch_size=spec.base_batch_size,
        factor=factor,
        lr=lr,
        warmup_steps=warmup,
        adam=adam,
        betas=betas,
        eps=eps,
        measured=measured,
        **recipe_fields,
    )
    return plan, warnings + recipe_warnings
