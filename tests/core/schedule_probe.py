"""Run by tests/core/test_recipe_schedules.py as a process of its own: reads one request a line
on stdin, {"tool", "text" (the export), "steps", "global_batch", "data_parallel_size"}, and
prints "RESULT " and the lr of every optimizer step as the tool's own code reads the export and
steps its own scheduler, as JSON (or {"error": ...}). Importing the three tools costs seconds;
one process answers every request of a test session.

- deepspeed: `DeepSpeedConfig` reads the JSON (in a process group of one, as DeepSpeed needs),
  the engine's own `_scheduler_from_config` builds the scheduler on an optimizer at the
  config's lr, and each step runs at the optimizer's lr before `scheduler.step()` (the engine
  steps it after every optimizer step, `_take_model_step`).
- torchtitan: its `ConfigManager` reads the TOML (torchtitan_loader.py's package without its
  `__init__`), `build_lr_schedulers` builds its scheduler from `[lr_scheduler]` and
  `training.steps`, stepped after each optimizer step as its train loop does.
- megatron: the MEGATRON_ARGS array, turned into megatron-core's `OptimizerParamScheduler` the
  way Megatron-LM's `training.get_optimizer_param_scheduler` does for --train-iters (steps in
  samples: iterations x global batch), stepped by the global batch after each iteration.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from deepspeed_gloo import init_gloo
from torchtitan_loader import _package_without_init


def _optimizer(lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def _run(optimizer: torch.optim.Optimizer, step: Any, steps: int) -> list[float]:
    lrs = []
    for _ in range(steps):
        lrs.append(float(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        step()
    return lrs


class _DataParallelUnit:
    def __init__(self, size: int) -> None:
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


def deepspeed_lrs(request: dict[str, Any]) -> list[float]:
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.engine import DeepSpeedEngine

    c = DeepSpeedConfig(json.loads(request["text"]), mpu=_DataParallelUnit(request["data_parallel_size"]))
    optimizer = _optimizer(c.optimizer_params["lr"])
    engine = SimpleNamespace(
        scheduler_name=lambda: c.scheduler_name, scheduler_params=lambda: c.scheduler_params
    )
    scheduler = DeepSpeedEngine._scheduler_from_config(engine, optimizer)  # type: ignore[arg-type]
    return _run(optimizer, scheduler.step if scheduler else (lambda: None), request["steps"])


def torchtitan_lrs(request: dict[str, Any]) -> list[float]:
    from torchtitan.components.lr_scheduler import build_lr_schedulers
    from torchtitan.config.manager import ConfigManager

    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(request["text"])
    try:
        config = ConfigManager().parse_args(["--job.config_file", f.name])
    finally:
        os.unlink(f.name)
    optimizer = _optimizer(config.optimizer.lr)
    schedulers = build_lr_schedulers([optimizer], config.lr_scheduler, config.training.steps)  # type: ignore[arg-type]
    return _run(optimizer, schedulers.step, request["steps"])


def megatron_args(text: str) -> dict[str, list[str]]:
    lines = text.splitlines()
    start = lines.index("MEGATRON_ARGS=(") + 1
    args = {}
    for line in lines[start : lines.index(")", start)]:
        flag, *values = line.split()
        args[flag] = values
    return args


def megatron_lrs(request: dict[str, Any]) -> list[float]:
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    args, batch = megatron_args(request["text"]), request["global_batch"]

    def value(flag: str, default: float) -> float:
        return float(args[flag][0]) if flag in args else default

    train_iters = int(args["--train-iters"][0])
    decay_iters = int(value("--lr-decay-iters", train_iters))
    optimizer = _optimizer(0.0)
    scheduler = OptimizerParamScheduler(
        optimizer,  # type: ignore[arg-type]
        init_lr=value("--lr-warmup-init", 0.0),
        max_lr=float(args["--lr"][0]),
        min_lr=value("--min-lr", 0.0),
        lr_warmup_steps=int(value("--lr-warmup-iters", 0)) * batch,
        lr_decay_steps=decay_iters * batch,
        lr_decay_style=args["--lr-decay-style"][0],
        start_wd=value("--weight-decay", 0.01),
        end_wd=value("--weight-decay", 0.01),
        wd_incr_steps=train_iters * batch,
        wd_incr_style="constant",
    )
    return _run(optimizer, lambda: scheduler.step(increment=batch), request["steps"])


TOOLS = {"deepspeed": deepspeed_lrs, "torchtitan": torchtitan_lrs, "megatron": megatron_lrs}


def main() -> None:
    init_gloo()
    _package_without_init()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer: dict[str, Any] = {"lrs": TOOLS[request["tool"]](request)}
        except Exception as err:  # the test shows what the tool said
            answer = {"error": f"{type(err).__name__}: {err}"}
        print("RESULT " + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
