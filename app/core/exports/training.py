"""What every format writes the same way about training: the optimizer (SGD's momentum, Adam's
adjusted betas and eps), the one lr schedule, and the steps per epoch."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.exports.export_types import ExportInput

# The plan does not choose a momentum; every format writes this one, so an SGD plan runs the
# same optimizer whichever export launches it (Goyal et al.'s ImageNet recipe uses 0.9).
SGD_MOMENTUM = 0.9


@dataclass(frozen=True, slots=True)
class OptimizerSettings:
    name: str  # the plan's optimizer: sgd, lars, adam, adamw, lamb
    momentum: float | None  # SGD-like
    betas: tuple[float, float] | None  # Adam-like: the square-root rule's, when it applies
    eps: float | None


def optimizer_settings(x: ExportInput) -> OptimizerSettings | None:
    lr, spec = x.plan.learning_rate, x.request.learning_rate
    if lr is None or spec is None:
        return None
    if lr.optimizer in ("sgd", "lars"):
        return OptimizerSettings(lr.optimizer, SGD_MOMENTUM, None, None)
    if lr.adam is not None and lr.adam.valid:
        return OptimizerSettings(lr.optimizer, None, (lr.adam.beta1, lr.adam.beta2), lr.adam.eps)
    return OptimizerSettings(lr.optimizer, None, spec.betas, spec.eps)


def optimizer_sentence(x: ExportInput) -> str:
    o = optimizer_settings(x)
    assert o is not None
    if o.momentum is not None:
        return f"optimizer {o.name}, momentum {o.momentum!r}, no weight decay"
    assert o.betas is not None
    return f"optimizer {o.name}, betas ({o.betas[0]!r}, {o.betas[1]!r}), eps {o.eps!r}, no weight decay"


def schedule_sentence(x: ExportInput) -> str:
    """The one lr schedule every format writes: linear warmup, then constant. Decay over a run
    is the run's choice (POST /v1/plans/schedule draws one); no export adds it unasked."""
    lr = x.plan.learning_rate
    assert lr is not None
    if lr.warmup_steps == 0:
        return f"lr schedule: constant {lr.lr!r}"
    return (
        f"lr schedule: linear warmup from {lr.warmup_start_lr!r} to {lr.lr!r} over {lr.warmup_steps} "
        f"optimizer steps, then constant {lr.lr!r}"
    )


def leftover_micro_batches(x: ExportInput) -> int:
    """Micro-batches per epoch past the plan's last whole optimizer step, which the plan (and
    the python skeleton) skip, while Lightning and the HF Trainer step on them."""
    s = x.plan.sampler
    return s.micro_steps_per_epoch % x.plan.gradient_accumulation_steps if s else 0


def leftover_sentence(x: ExportInput, tool: str) -> list[str]:
    """The steps-per-epoch sentence for a tool that steps on the leftover micro-batches."""
    leftover, s = leftover_micro_batches(x), x.plan.sampler
    if not leftover or s is None:
        return []
    return [
        f"steps per epoch: the plan counts {s.optimizer_steps_per_epoch}; {tool} takes "
        f"{s.optimizer_steps_per_epoch + 1}, stepping on the {leftover} micro-batches left over at the "
        f"end of each epoch"
    ]
