"""`deepspeed`: a ds_config.json with the batch sizes, optimizer and warmup scheduler."""

from __future__ import annotations

import json
from typing import Any

from app.core.exports.common import (
    Export,
    ExportInput,
    require_even,
)
from app.core.exports.training import optimizer_settings

_DEEPSPEED_OPTIMIZERS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "lamb": "Lamb"}

# JSON has no comments, and HF and Accelerate read this file with json.load: the one sentence a
# model-parallel plan needs travels as a key. DeepSpeed reads top-level keys by name and
# passes over this one without a warning (tests/exports check that).
NOTE_KEY = "batchplan_note"


def deepspeed_config(x: ExportInput) -> dict[str, Any]:
    require_even(x, "DeepSpeed", "takes one train_micro_batch_size_per_gpu for every rank")
    p = x.plan
    assert p.micro_batch_size is not None
    config: dict[str, Any] = {}
    if p.model_parallel_size > 1:
        config[NOTE_KEY] = (
            f"model-parallel size {p.model_parallel_size}: pass your model-parallel unit to "
            f"deepspeed.initialize(mpu=...), whose get_data_parallel_world_size() is "
            f"{p.data_parallel_size}; without it DeepSpeed divides the batch over all "
            f"{p.world_size} GPUs and refuses these numbers"
        )
    # DeepSpeed's rule: train_batch_size == micro x accumulation x data-parallel world size.
    config |= {
        "train_batch_size": p.global_batch_size,
        "train_micro_batch_size_per_gpu": p.micro_batch_size,
        "gradient_accumulation_steps": p.gradient_accumulation_steps,
    }
    lr, o = p.learning_rate, optimizer_settings(x)
    if lr is not None and o is not None and o.name in _DEEPSPEED_OPTIMIZERS:
        params: dict[str, Any] = {"lr": lr.lr}
        if o.momentum is not None:
            params["momentum"] = o.momentum
        if o.betas is not None:
            params |= {"betas": list(o.betas), "eps": o.eps, "weight_decay": 0.0}
        config["optimizer"] = {"type": _DEEPSPEED_OPTIMIZERS[o.name], "params": params}
    if lr is not None and lr.warmup_steps > 0:
        # WarmupLR: linear warmup, then constant, the schedule every export writes
        # (WarmupDecayLR would decay to 0 over the run, which no other format does).
        config["scheduler"] = {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": lr.warmup_start_lr,
                "warmup_max_lr": lr.lr,
                "warmup_num_steps": lr.warmup_steps,
                # DeepSpeed's default warmup is logarithmic; the plan's is linear.
                "warmup_type": "linear",
            },
        }
    return config


def export_deepspeed(x: ExportInput) -> Export:
    return Export(
        "deepspeed", "application/json", "ds_config.json", json.dumps(deepspeed_config(x), indent=2) + "\n"
    )
