"""`hf-trainer`: Hugging Face `TrainingArguments(...)` as Python source."""

from __future__ import annotations

from typing import Any

from app.core.exports.common import (
    Export,
    ExportInput,
    comment,
    lr_values,
    python_call,
    require_data_parallel,
    require_even,
    summary,
)
from app.core.exports.training import leftover_sentence, optimizer_settings

# The Trainer's names for the plan's optimizers. It has no LARS or LAMB: SGD and AdamW stand
# in, as in the python skeleton, and the note says so.
_OPTIM = {"sgd": "sgd", "lars": "sgd", "adam": "adamw_torch", "adamw": "adamw_torch", "lamb": "adamw_torch"}


def training_arguments(x: ExportInput) -> dict[str, Any]:
    require_even(x, "the HF Trainer", "takes one per_device_train_batch_size")
    require_data_parallel(x, "the HF Trainer's TrainingArguments")
    p = x.plan
    values: dict[str, Any] = {
        "output_dir": x.options.job_name,
        "per_device_train_batch_size": p.micro_batch_size,
        "gradient_accumulation_steps": p.gradient_accumulation_steps,
    }
    lr, warmup, _ = lr_values(x)
    o = optimizer_settings(x)
    if lr is not None and o is not None:
        values |= {
            "learning_rate": lr,
            "warmup_steps": warmup,
            # Linear warmup, then constant: the schedule every export writes.
            "lr_scheduler_type": "constant_with_warmup",
            "optim": _OPTIM[o.name],
            "weight_decay": 0.0,
        }
        if o.momentum is not None:
            values["optim_args"] = f"momentum={o.momentum!r}"
        if o.betas is not None:
            values |= {"adam_beta1": o.betas[0], "adam_beta2": o.betas[1], "adam_epsilon": o.eps}
    if p.sampler is not None:
        values |= {"dataloader_drop_last": p.sampler.drop_last, "seed": p.sampler.seed}
        if p.sampler.epochs is not None:
            values["num_train_epochs"] = p.sampler.epochs
    return values


def export_hf_trainer(x: ExportInput) -> Export:
    values = training_arguments(x)
    p = x.plan
    notes = {
        "per_device_train_batch_size": f"x {p.gradient_accumulation_steps} accumulation x "
        f"{p.data_parallel_size} processes = {p.global_batch_size}",
    }
    lr, o = p.learning_rate, optimizer_settings(x)
    if lr is not None and o is not None:
        notes["warmup_steps"] = f"the Trainer warms up from 0, not from {lr.warmup_start_lr!r}"
        if o.name in ("lars", "lamb"):
            notes["optim"] = f"the Trainer has no {o.name.upper()}: a stand-in, plug in yours"
    header = summary(x) + leftover_sentence(x, "the Trainer")
    text = "\n".join(
        [
            comment(header),
            "# Launch with torchrun (see the torchrun export); the Trainer reads the world size from it.",
            "from transformers import TrainingArguments",
            "",
            python_call("training_args = TrainingArguments", values, notes),
            "",
        ]
    )
    return Export("hf-trainer", "text/plain", "training_args.py", text)
