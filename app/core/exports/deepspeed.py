"""`deepspeed`: a ds_config.json with the batch sizes, the optimizer, the lr scheduler and the
gradient clipping of the plan's recipe (deepspeed_schedule.py maps the schedule).

DeepSpeed builds the optimizer from `optimizer` (its "Adam" is AdamW unless `adam_w_mode` is
false; any other name is `torch.optim.<name>`), clips at `gradient_clipping` (0: off), and
steps the scheduler after every optimizer step.
"""

from __future__ import annotations

import json
from typing import Any

from app.core.exports.parts.common import law_lines, require_even
from app.core.exports.parts.deepspeed_schedule import deepspeed_scheduler
from app.core.exports.parts.export_types import Export, ExportInput, ExportUnsupported
from app.core.exports.parts.training import optimizer_settings, warmup_field

_DEEPSPEED_OPTIMIZERS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "lamb": "Lamb"}

# JSON has no comments, and HF and Accelerate read this file with json.load: the sentences a
# plan needs travel as a key. DeepSpeed reads top-level keys by name and passes over this one
# without a warning (tests/exports check that).
NOTE_KEY = "batchplan_note"


def _optimizer(x: ExportInput) -> dict[str, Any] | None:
    lr, o = x.plan.learning_rate, optimizer_settings(x)
    if lr is None or o is None:
        return None
    if o.name not in _DEEPSPEED_OPTIMIZERS:
        raise ExportUnsupported(
            f"DeepSpeed has no {o.name} optimizer (it builds Adam, AdamW, Lamb and torch.optim's): "
            f"choose sgd, adam, adamw or lamb, or pass your optimizer to deepspeed.initialize",
            pointer="/learning_rate/optimizer",
        )
    params: dict[str, Any] = {"lr": lr.lr}
    if o.momentum is not None:
        params |= {"momentum": o.momentum, "nesterov": o.nesterov}
    if o.betas is not None:
        params |= {"betas": list(o.betas), "eps": o.eps}
    params["weight_decay"] = o.weight_decay
    if o.name == "adam":
        # Without it DeepSpeed's "Adam" decouples the weight decay (AdamW); torch's Adam adds it
        # to the gradient.
        params["adam_w_mode"] = False
    return {"type": _DEEPSPEED_OPTIMIZERS[o.name], "params": params}


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
    if law_lines(x):
        config[NOTE_KEY] = "; ".join(filter(None, (config.get(NOTE_KEY), *law_lines(x))))
    # DeepSpeed's rule: train_batch_size == micro x accumulation x data-parallel world size.
    config |= {
        "train_batch_size": p.global_batch_size,
        "train_micro_batch_size_per_gpu": p.micro_batch_size,
        "gradient_accumulation_steps": p.gradient_accumulation_steps,
    }
    optimizer = _optimizer(x)
    if optimizer is not None and p.learning_rate is not None:
        scheduler, first_lr = deepspeed_scheduler(p.learning_rate, warmup_field(x))
        # DeepSpeed steps its scheduler after each optimizer step and never before the first:
        # the optimizer's own lr is step 0's.
        optimizer["params"]["lr"] = first_lr
        config["optimizer"] = optimizer
        if scheduler is not None:
            config["scheduler"] = scheduler
        # Stated also when off (0): clipping is the recipe's, not DeepSpeed's default.
        clip = p.learning_rate.max_grad_norm
        config["gradient_clipping"] = clip if clip is not None else 0.0
    return config


def export_deepspeed(x: ExportInput) -> Export:
    return Export(
        "deepspeed", "application/json", "ds_config.json", json.dumps(deepspeed_config(x), indent=2) + "\n"
    )
