"""The recipe as Python source, for the exports that write training code (python, hf-trainer,
lightning, accelerate): the lr of every step as batchplan's own function (its source text,
`app.core.learning_rate.lr_schedule.LR_AT_SOURCE`, so the pasted file and the plan agree step for step
without importing batchplan), and the torch optimizer with the plan's settings.

A plan without `learning_rate` gets a placeholder recipe (SGD at 0.1, momentum 0.9, constant),
said so in the code.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

from app.core.exports.parts.python_literal import py_literal
from app.core.exports.parts.training import OptimizerSettings, optimizer_settings
from app.core.learning_rate.lr_schedule import LR_AT_SOURCE
from app.core.learning_rate.recipe import DEFAULT_MOMENTUM
from app.core.records.plan import LearningRatePlan

if TYPE_CHECKING:
    from app.core.exports.parts.export_types import ExportInput

PLACEHOLDER_LR = LearningRatePlan(
    optimizer="sgd",
    rule="none",
    requested_rule="none",
    base_lr=0.1,
    base_batch_size=1,
    factor=1.0,
    lr=0.1,
    warmup_steps=0,
    warmup_start_lr=0.1,
    momentum=DEFAULT_MOMENTUM,
    schedule="constant 0.1 (a placeholder: the plan has no learning_rate)",
)
PLACEHOLDER_OPTIMIZER = OptimizerSettings("sgd", DEFAULT_MOMENTUM, None, None)


def recipe(x: ExportInput) -> tuple[LearningRatePlan, OptimizerSettings]:
    """The plan's lr and optimizer, or the placeholder's."""
    lr, o = x.plan.learning_rate, optimizer_settings(x)
    if lr is None or o is None:
        return PLACEHOLDER_LR, PLACEHOLDER_OPTIMIZER
    return lr, o


def lr_block(x: ExportInput) -> str:
    """`lr_at` and `planned_lr(step)`, the plan's lr at every optimizer step (needs `import math`)."""
    lr, _ = recipe(x)
    # The arguments this schedule reads, as one would write them (lr_at's defaults left out).
    args: dict[str, object] = {"start": lr.warmup_start_lr, "peak": lr.lr, "warmup": lr.warmup_steps}
    if lr.decay != "constant":
        args["decay"] = lr.decay
    if lr.decay in ("linear", "cosine"):
        args |= {"floor": lr.min_lr, "last_step": lr.train_steps - 1 if lr.train_steps else None}
    if lr.decay == "step":
        args |= {"milestones": lr.milestones, "gamma": lr.gamma if lr.gamma is not None else 0.1}
    call = ", ".join(f"{k}={py_literal(v)}" for k, v in args.items())
    doc = textwrap.wrap(f"The plan's lr at optimizer step `step` (from 0): {lr.schedule}.", 88)
    docstring = [f'    """{doc[0]}', *(f"    {line}" for line in doc[1:])]
    docstring[-1] += '"""' if len(doc) == 1 else '\n    """'
    return "\n".join(
        [
            "# The lr of every optimizer step: batchplan's own function",
            "# (app.core.learning_rate.lr_schedule), so this file and the plan's schedule",
            "# agree step for step.",
            LR_AT_SOURCE.rstrip(),
            "",
            "",
            "def planned_lr(step: int) -> float:",
            *docstring,
            f"    return lr_at(step, {call})",
        ]
    )


def optimizer_call(x: ExportInput, params: str) -> str:
    """`torch.optim.<Class>(params, lr=..., ...)` with the plan's settings."""
    lr, o = recipe(x)
    kwargs = ", ".join(f"{k}={py_literal(v)}" for k, v in o.torch_kwargs().items())
    return f"torch.optim.{o.torch_class}({params}, lr={lr.lr!r}, {kwargs})"


def optimizer_note(x: ExportInput) -> str:
    """Why the optimizer is what it is, as a comment: the stand-ins and the decay's kind."""
    _, o = recipe(x)
    notes = []
    if o.name in ("lars", "lamb"):
        notes.append(f"torch has no {o.name.upper()}: {o.torch_class} stands in, plug in yours")
    if o.weight_decay:
        kind = "decoupled (AdamW)" if o.torch_class == "AdamW" else "L2, added to the gradient"
        notes.append(f"weight decay {o.weight_decay!r} on every parameter, {kind}")
    return "; ".join(notes)


def scheduler_call(x: ExportInput, optimizer: str) -> str:
    """A LambdaLR that gives `optimizer` the plan's lr at every step: step it once per optimizer
    step, never per micro-batch or per process."""
    lr, _ = recipe(x)
    return f"torch.optim.lr_scheduler.LambdaLR({optimizer}, lambda step: planned_lr(step) / {lr.lr!r})"


def max_grad_norm(x: ExportInput) -> float | None:
    return recipe(x)[1].max_grad_norm
