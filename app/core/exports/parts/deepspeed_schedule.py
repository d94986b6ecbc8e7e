"""The plan's lr schedule as a DeepSpeed `scheduler` block, or a refusal where none of
DeepSpeed's schedulers gives the plan's lr at every step.

DeepSpeed steps its scheduler after each optimizer step, never before the first, so step k runs
at the lr the scheduler set after k steps, and step 0 at the optimizer's own lr. Its WarmupLR
family, built with `last_batch_iteration` 0 (step 0 done), then gives step k the lr of its
iteration k; DeepSpeed's config also names any `torch.optim.lr_scheduler` class, which torch
steps the same way. What follows, step for step (s the warmup's start, p the peak, W the warmup,
f the floor, L the last step, T = L + 1 the run):

- no warmup: constant (no scheduler), LinearLR to f/p over L steps, CosineAnnealingLR(T_max L,
  eta_min f), MultiStepLR(milestones, gamma);
- warmup, then constant: WarmupLR(s, p, W), the optimizer at s (W = 1: s, then p);
- warmup, then linear decay to f = s: WarmupDecayLR(total L), which decays to its warmup's
  start (W >= 2: it warms up over 2 steps at least);
- warmup, then linear decay otherwise, and cosine decay after a one-step warmup: torch's
  OneCycleLR over T steps, max_lr p, div_factor p/s (its start), final_div_factor s/f (its
  floor), pct_start (W + 1)/T (its warmup phase ends at step pct_start x T - 1 = W), its
  anneal_strategy linear (cos after one step: the warmup phase is step 0 alone), and
  cycle_momentum false (else it overwrites the optimizer's momentum). Its start and floor are
  the peak divided by both factors, so s and f must be above 0: within an ulp or two of them,
  1e-14 relative at every step;
- refused: a zero start or floor there (the other not), cosine after a longer warmup (OneCycleLR
  anneals its warmup by the same cosine; WarmupCosineLR's warmup stops one step short of its
  peak and its decay starts there), and step decay after a warmup (no JSON scheduler chains a
  warmup with MultiStepLR).
"""

from __future__ import annotations

from typing import Any

from app.core.exports.parts.export_types import ExportUnsupported
from app.core.records.plan import LearningRatePlan

_INSTEAD = (
    "pass the python export's planned_lr to deepspeed.initialize(lr_scheduler=lambda optimizer: "
    "torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: planned_lr(step) / lr))"
)
_LR = "learning_rate."


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


def _one_cycle(lr: LearningRatePlan, runs: int, anneal: str) -> dict[str, Any]:
    s, p, f = lr.warmup_start_lr, lr.lr, lr.min_lr
    return {
        "type": "OneCycleLR",
        "params": {
            "max_lr": p,
            "total_steps": runs,
            "pct_start": (lr.warmup_steps + 1) / runs,
            "anneal_strategy": anneal,
            "cycle_momentum": False,
            "div_factor": p / s,
            "final_div_factor": s / f,
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
    if decay == "linear" and warmup > 1 and f == s:
        assert last is not None
        return _warmup_block("WarmupDecayLR", lr, s, total_num_steps=last), s
    one_cycle = decay == "linear" or (decay == "cosine" and warmup == 1)
    if one_cycle and s > 0 and f > 0:
        assert last is not None
        return _one_cycle(lr, last + 1, "linear" if decay == "linear" else "cos"), s
    if one_cycle:
        raise _zero_refusal(lr, warmup_field)
    raise ExportUnsupported(
        f"DeepSpeed's schedulers cannot give {decay} decay after a warmup of {warmup} steps as the plan "
        "does "
        + (
            "(OneCycleLR would anneal the warmup by the same cosine; WarmupCosineLR's warmup stops one "
            "step short of the peak and its decay starts there): cosine decay without warmup or after "
            "a one-step warmup DeepSpeed can"
            if decay == "cosine"
            else "(no scheduler in its config chains a warmup with MultiStepLR): step decay without "
            "warmup DeepSpeed can"
        )
        + f", or {_INSTEAD}",
        pointer="/learning_rate/decay",
        suggestions={_LR + warmup_field: [1, 0] if decay == "cosine" else [0]},
    )


def _zero_refusal(lr: LearningRatePlan, warmup_field: str) -> ExportUnsupported:
    """A linear decay (or cosine after one warmup step) whose start or floor is 0, the other
    not, or both 0 after one step: OneCycleLR makes both by dividing the peak."""
    s, f = lr.warmup_start_lr, lr.min_lr
    zero, other, value = ("warmup_start_lr", "min_lr", f) if s == 0 else ("min_lr", "warmup_start_lr", s)
    detail = (
        f"DeepSpeed's OneCycleLR, the scheduler that gives this {lr.decay} decay after its warmup, "
        f"starts and ends at its max_lr divided by factors: it cannot make {zero} 0"
    )
    if value > 0:
        detail += (
            f" while {other} is {value!r}: set {zero} above 0 (for instance {value!r}), or {other} to 0 "
            "too where the warmup is 2 steps or more (WarmupDecayLR decays to its start)"
        )
    else:
        detail += ": set both above 0, or warm up over 2 steps or more (WarmupDecayLR decays to its start)"
    return ExportUnsupported(
        f"{detail}, or {_INSTEAD}",
        pointer=f"/learning_rate/{zero}",
        suggestions={_LR + other: [0], _LR + warmup_field: [2, 0]},
    )
