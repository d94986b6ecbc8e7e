"""The plan's lr schedule as a DeepSpeed `scheduler` block, or a refusal where none of
DeepSpeed's schedulers gives the plan's lr at every step.

DeepSpeed steps its scheduler after each optimizer step, never before the first, so step k runs
at the lr the scheduler set after k steps, and step 0 at the optimizer's own lr. Its WarmupLR
family, built with `last_batch_iteration` 0 (step 0 done), then gives step k the lr of its
iteration k; DeepSpeed's config also names any `torch.optim.lr_scheduler` class, which torch
steps the same way. What follows, step for step (s the warmup's start, p the peak, W the warmup,
f the floor, L the last step):

- no warmup: constant (no scheduler), LinearLR to f/p over L steps, CosineAnnealingLR(T_max L,
  eta_min f), MultiStepLR(milestones, gamma);
- warmup, then constant: WarmupLR(s, p, W), the optimizer at s (W = 1: s, then p);
- warmup, then linear decay: WarmupDecayLR(total L), which decays to its warmup's start, so
  only where f = s;
- warmup, then cosine or step decay: refused. WarmupCosineLR's warmup stops one step short of
  its peak and its decay starts there, so it never gives the peak lr; no JSON scheduler chains
  a warmup with MultiStepLR.
"""

from __future__ import annotations

from typing import Any

from app.core.exports.common import ExportUnsupported
from app.core.plan_types import LearningRatePlan

_INSTEAD = (
    "pass the python export's planned_lr to deepspeed.initialize(lr_scheduler=lambda optimizer: "
    "torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: planned_lr(step) / lr))"
)


def _warmup_block(kind: str, lr: LearningRatePlan, low: float, **extra: Any) -> dict[str, Any]:
    return {
        "type": kind,
        "params": {
            **extra,
            "warmup_min_lr": low,
            "warmup_max_lr": lr.lr,
            # DeepSpeed warms up over at least 2 steps; a warmup of 1 is step 0 alone.
            "warmup_num_steps": max(lr.warmup_steps, 2),
            "warmup_type": "linear",  # DeepSpeed's default is logarithmic
            "last_batch_iteration": 0,
        },
    }


def deepspeed_scheduler(lr: LearningRatePlan, warmup_field: str) -> tuple[dict[str, Any] | None, float]:
    """(the `scheduler` block, or None for a constant lr; the optimizer's lr, step 0's)."""
    s, p, warmup, f = lr.warmup_start_lr, lr.lr, lr.warmup_steps, lr.min_lr
    last = lr.train_steps - 1 if lr.train_steps else None
    decay = lr.decay
    if decay in ("linear", "cosine") and (last is None or last <= warmup):
        decay = "constant"  # the run ends before any decay
    if not warmup:
        return {
            "constant": None,
            "linear": {
                "type": "LinearLR",
                "params": {"start_factor": 1.0, "end_factor": f / p, "total_iters": last},
            },
            "cosine": {"type": "CosineAnnealingLR", "params": {"T_max": last, "eta_min": f}},
            "step": {"type": "MultiStepLR", "params": {"milestones": list(lr.milestones), "gamma": lr.gamma}},
        }[decay], p
    if decay == "constant":
        return _warmup_block("WarmupLR", lr, s if warmup > 1 else p), s
    pointer = f"/learning_rate/{warmup_field}"
    if decay == "linear" and warmup == 1:
        raise ExportUnsupported(
            "DeepSpeed's WarmupDecayLR warms up over at least 2 steps, the plan over 1: warm up over 2 "
            f"or more steps, or not at all, or {_INSTEAD}",
            pointer=pointer,
            suggestions={warmup_field: [0]},
        )
    if decay == "linear" and f != s:
        raise ExportUnsupported(
            f"DeepSpeed's WarmupDecayLR decays to the lr its warmup starts from: set min_lr to the "
            f"warmup_start_lr {s!r} (or warmup_start_lr to min_lr {f!r}), or {_INSTEAD}",
            pointer="/learning_rate/min_lr",
        )
    if decay == "linear":
        assert last is not None
        return _warmup_block("WarmupDecayLR", lr, s, total_num_steps=last), s
    raise ExportUnsupported(
        f"DeepSpeed's schedulers cannot give {decay} decay after a warmup as the plan does "
        + (
            "(WarmupCosineLR's warmup stops one step short of the peak and its decay starts there)"
            if decay == "cosine"
            else "(no scheduler in its config chains a warmup with MultiStepLR)"
        )
        + f": {decay} decay without warmup or linear decay after it DeepSpeed can, or {_INSTEAD}",
        pointer="/learning_rate/decay",
        suggestions={warmup_field: [0]},
    )
