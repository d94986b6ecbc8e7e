"""One replica's micro-step, timed at one micro-batch size (issue 38): the timed loop the
throughput kind (checks/throughput_check.py) runs at each size, and the bench's emulated
cluster runs on its own ranks.

Timing done as DESIGN.md says: the batch is built and moved to the device before the clock
starts (nothing is allocated in the loop but what the model's own step allocates), the warm-up
micro-steps are run and not timed (allocator, kernels, caches), the device is synchronised
before every clock read (CUDA), and the step time is the median of the repeats with their
spread. A repeat times as many micro-steps as make it last at least `MIN_REPEAT_S`, so that a
micro-step of tens of microseconds is not measured at the clock's resolution; each repeat's
time is divided by that count.

Without the optimizer step, a micro-step is a forward and a backward that accumulates into the
gradients (as every micro-step under gradient accumulation does: no zeroing, no allocation once
the gradients exist). With it, a step zeroes the gradients in place, runs forward and backward
and takes an AdamW step (its state made in the warm-up), as an optimizer step at accumulation 1.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from app.worker.measure.memory import is_out_of_memory, release_memory

MIN_REPEAT_S = 0.01  # a repeat's least duration: far above perf_counter's resolution
MAX_MICRO_STEPS_PER_REPEAT = 1000

Loss = Callable[[nn.Module, Any, Any], torch.Tensor]


@dataclass(frozen=True, slots=True)
class Timed:
    """A micro-batch size's repeats: each a micro-step's mean time over `per_repeat` of them."""

    times: tuple[float, ...]
    per_repeat: int
    peak_memory_bytes: int | None

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def spread(self) -> float:
        """The repeats' interquartile range over their median (0 with one repeat): robust to the
        odd repeat a busy host preempts, where (max - min) / median would report that one."""
        if len(self.times) < 2 or self.median <= 0:
            return 0.0
        lower, _, upper = statistics.quantiles(self.times, n=4, method="inclusive")
        return (upper - lower) / self.median


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def micro_step(
    module: nn.Module, loss: Loss, x: Any, y: Any, optimizer: torch.optim.Optimizer | None
) -> Callable[[], None]:
    """One micro-step on the prepared batch (x, y) (module docstring: with or without the
    optimizer's step)."""
    if optimizer is None:

        def step() -> None:
            loss(module, x, y).backward()  # type: ignore[no-untyped-call]

        return step

    def optimizer_step() -> None:
        optimizer.zero_grad(set_to_none=False)
        loss(module, x, y).backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    return optimizer_step


def time_steps(
    step: Callable[[], None],
    device: torch.device,
    *,
    repeats: int,
    warmup: int,
    min_repeat_s: float = MIN_REPEAT_S,
) -> Timed:
    """`step` run `warmup` times untimed, then `repeats` timed repeats (module docstring)."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(warmup):
        step()
    synchronize(device)
    started = time.perf_counter()
    step()  # the calibration: how many micro-steps make a repeat last MIN_REPEAT_S
    synchronize(device)
    one = time.perf_counter() - started
    per_repeat = min(MAX_MICRO_STEPS_PER_REPEAT, max(1, math.ceil(min_repeat_s / max(one, 1e-9))))
    times = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        for _ in range(per_repeat):
            step()
        synchronize(device)
        times.append((time.perf_counter() - started) / per_repeat)
    peak = int(torch.cuda.max_memory_allocated(device)) if cuda else None
    return Timed(tuple(times), per_repeat, peak)


def time_micro_batch(
    module: nn.Module,
    loss: Loss,
    batch: Callable[[int], tuple[Any, Any]],
    size: int,
    device: torch.device,
    *,
    repeats: int,
    warmup: int,
    optimizer: bool,
    min_repeat_s: float = MIN_REPEAT_S,
) -> Timed | None:
    """One size's micro-step, timed; None when it ran out of device memory (freed again)."""
    step_optimizer = None
    try:
        x, y = batch(size)  # before the clock: nothing is allocated in the timed loop
        if optimizer:
            step_optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-6)
        return time_steps(
            micro_step(module, loss, x, y, step_optimizer), device, repeats=repeats, warmup=warmup
        )
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        return None
    finally:
        if step_optimizer is not None:
            step_optimizer.state.clear()
        module.zero_grad(set_to_none=True)
        if device.type == "cuda":
            release_memory(device)
