"""`hf-trainer`: Hugging Face `TrainingArguments(...)` as Python source."""

from __future__ import annotations

from typing import Any

from app.core.exports.common import (
    Export,
    ExportInput,
    comment,
    lr_values,
    python_call,
    require_even,
    summary,
)


def training_arguments(x: ExportInput) -> dict[str, Any]:
    require_even(x, "the HF Trainer", "takes one per_device_train_batch_size")
    p = x.plan
    values: dict[str, Any] = {
        "output_dir": x.options.job_name,
        "per_device_train_batch_size": p.micro_batch_size,
        "gradient_accumulation_steps": p.gradient_accumulation_steps,
    }
    lr, warmup, _ = lr_values(x)
    if lr is not None:
        values |= {"learning_rate": lr, "warmup_steps": warmup, "lr_scheduler_type": "linear"}
    if p.sampler is not None:
        values |= {"dataloader_drop_last": p.sampler.drop_last, "seed": p.sampler.seed}
        if p.sampler.epochs is not None:
            values["num_train_epochs"] = p.sampler.epochs
    return values


def export_hf_trainer(x: ExportInput) -> Export:
    values = training_arguments(x)
    notes = {
        "per_device_train_batch_size": f"x {x.plan.gradient_accumulation_steps} accumulation x "
        f"{x.plan.data_parallel_size} processes = {x.plan.global_batch_size}",
    }
    lr = x.plan.learning_rate
    if lr is not None:
        notes["warmup_steps"] = f"the Trainer warms up from 0, not from {lr.warmup_start_lr!r}"
    text = "\n".join(
        [
            comment(summary(x)),
            "# Launch with torchrun (see the torchrun export); the Trainer reads the world size from it.",
            "from transformers import TrainingArguments",
            "",
            python_call("training_args = TrainingArguments", values, notes),
            "",
        ]
    )
    return Export("hf-trainer", "text/plain", "training_args.py", text)
