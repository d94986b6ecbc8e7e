"""One replica's micro-step, timed at each micro-batch size (issue 38): the timed loop the
throughput kind (checks/throughput_check.py) runs, and the bench's emulated cluster runs on its
own ranks.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from app.worker.measure.memory import is_out_of_memory, release_memory

MIN_REPEAT_S = 0.01  # a repeat's least duration: far above perf_counter's resolution
# A size whose repeats spread more than its bound gets up to this many times its repeats again,
# in rounds of its own, before its point is given as it is (and flagged noisy).
REMEASURE_ROUNDS = 2
MAX_MICRO_STEPS_PER_REPEAT = 1000
# Micro-steps timed one by one after the warm-up; the fastest says how many make a repeat (the
# fastest: one preempted step must not make every repeat of its size a few micro-steps short).
CALIBRATION_STEPS = 3

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


def _timed_once(step: Callable[[], None], device: torch.device) -> float:
    synchronize(device)
    started = time.perf_counter()
    step()
    synchronize(device)
    return time.perf_counter() - started


@dataclass
class _Size:
    """A size being timed: its prepared micro-step and its repeats so far."""

    size: int
    step: Callable[[], None]
    per_repeat: int
    times: list[float]
    peak: int


def _rounds(sizes: list[_Size], repeats: int, device: torch.device) -> None:
    """`repeats` rounds, each one repeat of every size in turn."""
    cuda = device.type == "cuda"
    for _ in range(repeats):
        for s in sizes:
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            synchronize(device)
            started = time.perf_counter()
            for _ in range(s.per_repeat):
                s.step()
            synchronize(device)
            s.times.append((time.perf_counter() - started) / s.per_repeat)
            if cuda:
                s.peak = max(s.peak, int(torch.cuda.max_memory_allocated(device)))


# Over 60 lines: warm-up, calibration and the rounds that take turns over the sizes share
# the clock and each size's samples; apart, every part would carry all of them.
def time_sizes(
    module: nn.Module,
    loss: Loss,
    batch: Callable[[int], tuple[Any, Any]],
    sizes: Sequence[int],
    device: torch.device,
    *,
    repeats: int,
    warmup: int,
    optimizer: bool,
    min_repeat_s: float = MIN_REPEAT_S,
    spread_bound: float | None = None,
) -> tuple[dict[int, Timed], int | None]:
    """Each size's micro-step timed, and the first size that ran out of device memory (None:
    none did; the larger sizes were not tried).

    First each size in turn is prepared: its batch made on the device, `warmup` micro-steps, and
    three more, the fastest of which says how many micro-steps a repeat takes (module docstring).
    Then `repeats` rounds each time one repeat of every size in turn: a burst of load from elsewhere on the
    host lands on a repeat of every size alike, where timing the sizes one after another would
    put it all in one size's repeats, and a point's median drops it. With `spread_bound`, a size
    whose repeats then spread more than it is remeasured: `repeats` more rounds of the noisy
    sizes alone, up to REMEASURE_ROUNDS times, its point over all its repeats."""
    cuda = device.type == "cuda"
    params = [p for p in module.parameters() if p.requires_grad]
    step_optimizer = torch.optim.AdamW(params, lr=1e-6) if optimizer and params else None
    prepared: list[_Size] = []
    out_of_memory = None
    try:
        for b in sizes:
            try:
                if cuda:
                    torch.cuda.reset_peak_memory_stats(device)
                x, y = batch(b)  # before the clock: nothing is allocated in the timed loop
                step = micro_step(module, loss, x, y, step_optimizer)
                for _ in range(warmup):
                    step()
                one = min(_timed_once(step, device) for _ in range(CALIBRATION_STEPS))
            except Exception as error:
                if not is_out_of_memory(error):
                    raise
                out_of_memory = b
                break
            per_repeat = min(MAX_MICRO_STEPS_PER_REPEAT, max(1, math.ceil(min_repeat_s / max(one, 1e-9))))
            peak = int(torch.cuda.max_memory_allocated(device)) if cuda else 0
            prepared.append(_Size(b, step, per_repeat, [], peak))
        _rounds(prepared, repeats, device)
        for _ in range(REMEASURE_ROUNDS if spread_bound is not None else 0):
            noisy = [s for s in prepared if Timed(tuple(s.times), 1, None).spread > (spread_bound or 0)]
            if not noisy:
                break
            _rounds(noisy, repeats, device)
    finally:
        if step_optimizer is not None:
            step_optimizer.state.clear()
        module.zero_grad(set_to_none=True)
        if cuda:
            release_memory(device)
    timed = {s.size: Timed(tuple(s.times), s.per_repeat, s.peak if cuda else None) for s in prepared}
    return timed, out_of_memory
