"""What every format writes the same way about training: the plan's optimizer (SGD's momentum
and nesterov, Adam's adjusted betas and eps, weight decay, clipping), the one lr schedule (the
plan's `learning_rate.schedule`), and what becomes of the micro-batches left over at an
epoch's end."""

from __future__ import annotations

from app.core.exports.parts.export_types import ExportInput
from app.core.learning_rate.recipe import DEFAULT_MOMENTUM
from app.core.records.record import record

# torch has no LARS or LAMB: the formats that build a torch optimizer use these stand-ins, and
# say so (the reference run does the same).
TORCH_OPTIMIZERS = {"sgd": "SGD", "lars": "SGD", "adam": "Adam", "adamw": "AdamW", "lamb": "AdamW"}


@record
class OptimizerSettings:
    name: str  # the plan's optimizer: sgd, lars, adam, adamw, lamb
    momentum: float | None  # SGD-like
    betas: tuple[float, float] | None  # Adam-like: the square-root rule's, when it applies
    eps: float | None
    nesterov: bool = False
    weight_decay: float = 0.0
    max_grad_norm: float | None = None  # None: no clipping

    @property
    def torch_class(self) -> str:
        return TORCH_OPTIMIZERS[self.name]

    def torch_kwargs(self) -> dict[str, object]:
        """The keyword arguments of `torch.optim.<torch_class>(params, lr=..., **these)`."""
        if self.momentum is not None:
            return {"momentum": self.momentum, "nesterov": self.nesterov, "weight_decay": self.weight_decay}
        return {"betas": self.betas, "eps": self.eps, "weight_decay": self.weight_decay}


def optimizer_settings(x: ExportInput) -> OptimizerSettings | None:
    lr = x.plan.learning_rate
    if lr is None:
        return None
    momentum = None if lr.betas is not None else DEFAULT_MOMENTUM if lr.momentum is None else lr.momentum
    return OptimizerSettings(
        lr.optimizer, momentum, lr.betas, lr.eps, lr.nesterov, lr.weight_decay, lr.max_grad_norm
    )


def optimizer_sentence(x: ExportInput) -> str:
    o = optimizer_settings(x)
    assert o is not None
    if o.momentum is not None:
        head = f"optimizer {o.name}, momentum {o.momentum!r}" + (", nesterov" if o.nesterov else "")
    else:
        assert o.betas is not None
        head = f"optimizer {o.name}, betas ({o.betas[0]!r}, {o.betas[1]!r}), eps {o.eps!r}"
    decay = f"weight decay {o.weight_decay!r}" if o.weight_decay else "no weight decay"
    clip = (
        f"gradient clipping at global norm {o.max_grad_norm!r}"
        if o.max_grad_norm is not None
        else "no gradient clipping"
    )
    return f"{head}, {decay}, {clip}"


def schedule_sentence(x: ExportInput) -> str:
    """The plan's lr schedule, stepped once per optimizer step, in the words the plan states it."""
    lr = x.plan.learning_rate
    assert lr is not None
    return f"lr schedule: {lr.schedule}"


def run_length(x: ExportInput) -> int | None:
    """The run's optimizer steps: the recipe's (train_steps, train_samples or the epochs'), or
    the epochs' alone for a plan without learning_rate."""
    lr, s = x.plan.learning_rate, x.plan.sampler
    if lr is not None and lr.train_steps is not None:
        return lr.train_steps
    return s.total_optimizer_steps if s else None


def warmup_field(x: ExportInput) -> str:
    """The request field the plan's warmup came from, for refusals that point at it."""
    spec = x.request.learning_rate
    return "warmup_epochs" if spec is not None and spec.warmup_epochs is not None else "warmup_steps"


def leftover_micro_batches(x: ExportInput) -> int:
    """Micro-batches per epoch past the plan's last whole optimizer step: the plan drops them
    (`sampler.leftover`), and every export makes its tool drop them too."""
    s = x.plan.sampler
    return s.leftover_micro_steps if s else 0


def leftover_sentence(x: ExportInput, how: str) -> list[str]:
    """The steps-per-epoch sentence for a tool that would otherwise step on the leftovers."""
    leftover, s = leftover_micro_batches(x), x.plan.sampler
    if not leftover or s is None:
        return []
    return [
        f"steps per epoch: {s.optimizer_steps_per_epoch}, as planned; the {leftover} micro-batches left "
        f"over at the end of each epoch are dropped ({how})"
    ]
