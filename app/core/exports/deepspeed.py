"""`deepspeed`: a ds_config.json with the batch sizes, optimizer and warmup scheduler."""

from __future__ import annotations

import json
from typing import Any

from app.core.exports.common import Export, ExportInput, require_even

_DEEPSPEED_OPTIMIZERS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "lamb": "Lamb"}


def deepspeed_config(x: ExportInput) -> dict[str, Any]:
    require_even(x, "DeepSpeed", "takes one train_micro_batch_size_per_gpu for every rank")
    p = x.plan
    assert p.micro_batch_size is not None
    # DeepSpeed's rule: train_batch_size == micro x accumulation x data-parallel world size.
    config: dict[str, Any] = {
        "train_batch_size": p.global_batch_size,
        "train_micro_batch_size_per_gpu": p.micro_batch_size,
        "gradient_accumulation_steps": p.gradient_accumulation_steps,
    }
    lr = p.learning_rate
    if lr is not None and lr.optimizer in _DEEPSPEED_OPTIMIZERS:
        params: dict[str, Any] = {"lr": lr.lr}
        if lr.adam is not None and lr.adam.valid:
            params |= {"betas": [lr.adam.beta1, lr.adam.beta2], "eps": lr.adam.eps}
        config["optimizer"] = {"type": _DEEPSPEED_OPTIMIZERS[lr.optimizer], "params": params}
    if lr is not None and lr.warmup_steps > 0:
        total = p.sampler.total_optimizer_steps if p.sampler else None
        sched: dict[str, Any] = {
            "warmup_min_lr": lr.warmup_start_lr,
            "warmup_max_lr": lr.lr,
            "warmup_num_steps": lr.warmup_steps,
            # DeepSpeed's default warmup is logarithmic; the plan's is linear.
            "warmup_type": "linear",
        }
        if total is not None and total > lr.warmup_steps:
            sched["total_num_steps"] = total
        config["scheduler"] = {
            "type": "WarmupDecayLR" if "total_num_steps" in sched else "WarmupLR",
            "params": sched,
        }
    return config


def export_deepspeed(x: ExportInput) -> Export:
    return Export(
        "deepspeed", "application/json", "ds_config.json", json.dumps(deepspeed_config(x), indent=2) + "\n"
    )
