"""Run by tests/core/test_exports_consumers.py in a process of its own (DeepSpeed's config
reads the world size from an initialized process group): reads [[config, dp_size], ...] as
JSON on stdin and prints, for each, DeepSpeed's own numbers or its refusal."""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from deepspeed.runtime.config import DeepSpeedConfig
from deepspeed.runtime.lr_schedules import WarmupLR
from deepspeed_gloo import init_gloo


class DataParallelUnit:
    """The part of a model-parallel unit (mpu) DeepSpeedConfig asks: the data-parallel size."""

    def __init__(self, size: int) -> None:
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


def numbers(config: dict[str, Any], dp: int) -> dict[str, Any]:
    try:
        c = DeepSpeedConfig(config, mpu=DataParallelUnit(dp))
    except AssertionError as err:
        return {"refused": str(err)}
    out: dict[str, Any] = {
        "world_size": c.world_size,
        "train_batch_size": c.train_batch_size,
        "micro": c.train_micro_batch_size_per_gpu,
        "accumulation": c.gradient_accumulation_steps,
        "optimizer": c.optimizer_name,
        "optimizer_params": c.optimizer_params,
        "scheduler": c.scheduler_name,
    }
    if c.scheduler_name == "WarmupLR":
        # As the engine runs it: each step at the optimizer's lr, the scheduler stepped after.
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=c.optimizer_params["lr"])
        scheduler = WarmupLR(optimizer, **c.scheduler_params)
        lrs = []
        for _ in range(c.scheduler_params["warmup_num_steps"] + 3):
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        out["lrs"] = lrs
    return out


def main() -> None:
    init_gloo()
    cases = json.load(sys.stdin)
    print("RESULT " + json.dumps([numbers(config, dp) for config, dp in cases]), flush=True)


if __name__ == "__main__":
    main()
