"""The one learning-rate function: the lr of every optimizer step of a plan's recipe.

`/v1/plans` (the lr at warmup's end and at the last step), `/v1/plans/schedule` and its chart,
the reference run and every export read the lr here. The python, hf-trainer, lightning and
accelerate exports carry `lr_at`'s own source text (`LR_AT_SOURCE`), so the file a user pastes
runs this very function without importing batchplan: it must stay self-contained (the
standard library's `math` only, plain arguments, no names from this package).
"""

from __future__ import annotations

import inspect
import math


def lr_at(
    step: int,
    *,
    start: float,
    peak: float,
    warmup: int,
    decay: str = "constant",
    floor: float = 0.0,
    last_step: int | None = None,
    milestones: tuple[int, ...] = (),
    gamma: float = 0.1,
) -> float:
    """The lr of optimizer step `step` (counted from 0).

    Linear warmup from `start` (at step 0) to `peak` (at step `warmup`), then `decay`:
    "constant" stays at `peak`; "linear" and "cosine" reach `floor` at `last_step` (the run's
    last optimizer step) and stay there; "step" multiplies `peak` by `gamma` at each milestone
    step reached (Goyal et al. 2017: x0.1 at epochs 30, 60 and 80).
    """
    if step < warmup:
        return start + (peak - start) * step / warmup
    if decay == "step":
        return peak * gamma ** sum(1 for m in milestones if step >= m)
    if decay == "constant" or last_step is None or last_step <= warmup or step == warmup:
        return peak
    # Written from the floor, so that the last step gives min_lr exactly.
    progress = min((step - warmup) / (last_step - warmup), 1.0)
    if decay == "linear":
        return floor + (peak - floor) * (1 - progress)
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))


LR_AT_SOURCE = inspect.getsource(lr_at)
