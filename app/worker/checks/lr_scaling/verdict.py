"""The lr-scaling probe's judgement (probe.py trains the runs): each rule's
final held-out loss over the base run's, whether it holds within the tolerance, the best rule,
the regime McCandlish et al. 2018 predict from the measured noise scale, and one sentence.

McCandlish et al.: the best SGD lr at batch B is eps_max / (1 + B_noise / B), so the linear rule
from a base batch b overshoots it by (B + B_noise) / (b + B_noise): about 1 (linear holds) while
B is well below B_noise, about B / B_noise (flat: a larger lr does not help) well above it. The
regime reads B against B_noise at the start (the initial weights: where a scaled lr first bites,
and what Goyal et al.'s warmup guards; the noise scale grows as the loss falls, so `end` is
larger), at the end where the start could not be measured: below B_noise / 4, within a factor
4 of it, or above 4 x B_noise.
"""

from __future__ import annotations

from app.contract.kinds.lr_scaling import (
    LossPoint,
    LrScalingResult,
    LrScalingSpec,
    ProbeBase,
    ProbeNoise,
    ProbeRule,
    ProbeRunSpec,
)

LossCurve = list[tuple[int, float | None]]  # (samples, held-out loss; None once diverged)
REGIME_FACTOR = 4.0


def regime(batch: int, b_noise: float | None) -> str:
    if b_noise is None:
        return "unknown"
    if batch <= b_noise / REGIME_FACTOR:
        return "below_noise_scale"
    if batch >= b_noise * REGIME_FACTOR:
        return "above_noise_scale"
    return "around_noise_scale"


def _points(curve: LossCurve) -> tuple[LossPoint, ...]:
    return tuple(LossPoint(samples, loss) for samples, loss in curve)


def judge(
    probe: LrScalingSpec,
    trained: list[tuple[ProbeRunSpec, LossCurve]],
    noise: tuple[float | None, float | None],
) -> LrScalingResult:
    """The result from every run's curve, the base run first."""
    (base_run, base_curve), rule_runs = trained[0], trained[1:]
    base_final = base_curve[-1][1]
    rules: list[ProbeRule] = []
    for run, curve in rule_runs:
        final = curve[-1][1]
        ratio = None if final is None or not base_final else final / base_final
        holds = ratio is not None and ratio <= 1 + probe.tolerance
        rules.append(ProbeRule(run.rule, run.recipe.lr, _points(curve), ratio, holds))
    finite = [r for r in rules if r.final_loss_ratio is not None]
    best = min(finite, key=lambda r: r.final_loss_ratio or 0.0).rule if finite else rules[0].rule
    plan_holds = next(r.holds for r in rules if r.rule == probe.plan_rule)
    G, b = probe.global_batch_size, base_run.batch_size
    start, end = noise
    b_noise = start if start is not None else end
    noise_scale = ProbeNoise(
        start=start,
        end=end,
        batch_to_noise=None if b_noise is None else G / b_noise,
        linear_overshoot=None if b_noise is None else (G + b_noise) / (b + b_noise),
    )
    found = regime(G, b_noise)
    return LrScalingResult(
        samples=probe.samples,
        global_batch_size=G,
        tolerance=probe.tolerance,
        label_noise=probe.label_noise,
        base=ProbeBase(b, base_run.recipe.lr, _points(base_curve)),
        rules=tuple(rules),
        best_rule=best,
        plan_rule=probe.plan_rule,
        plan_rule_holds=plan_holds,
        noise_scale=noise_scale,
        regime=found,
        verdict=verdict(probe, b, rules, best, b_noise, found)
        if base_final
        else f"the base run ({b:,} at lr {base_run.recipe.lr:.4g}) diverges over {probe.samples:,} samples, "
        f"so no rule can be held against it: lower base_lr (or probe fewer samples) and probe again",
    )


def _percent(ratio: float) -> str:
    return f"{abs(ratio - 1) * 100:.1f} %"


def _standing(rule: ProbeRule) -> str:
    ratio = rule.final_loss_ratio
    if ratio is None:
        return f"{rule.rule} (lr {rule.lr:.4g}) diverges"
    if ratio >= 1:
        return f"{rule.rule} (lr {rule.lr:.4g}) lags by {_percent(ratio)}"
    return f"{rule.rule} (lr {rule.lr:.4g}) ends {_percent(ratio)} below it"


def verdict(
    probe: LrScalingSpec, b: int, rules: list[ProbeRule], best: str, b_noise: float | None, found: str
) -> str:
    """One sentence in the user's numbers: the best rule against the base run, then the others."""
    G, samples = probe.global_batch_size, probe.samples
    top = next(r for r in rules if r.rule == best)
    ratio = top.final_loss_ratio
    run = f"the {b:,}-sample run over {samples:,} samples"
    if ratio is None:
        head = f"at {G:,}, every rule diverges against {run}"
    elif ratio <= 1:
        head = f"at {G:,}, {best} scaling to {top.lr:.4g} ends {_percent(ratio)} below {run}"
    elif top.holds:
        head = f"at {G:,}, {best} scaling to {top.lr:.4g} keeps the loss within {_percent(ratio)} of {run}"
    else:
        head = (
            f"at {G:,}, no rule holds: the best, {best} scaling to {top.lr:.4g}, lags {run} by "
            f"{_percent(ratio)} (tolerance {probe.tolerance * 100:g} %)"
        )
    others = [_standing(r) for r in rules if r.rule != best]
    noise = (
        "the noise scale could not be measured"
        if b_noise is None
        else f"B_noise ~ {b_noise:,.0f} puts {G:,} {found.replace('_', ' ')} "
        f"(McCandlish et al. predict linear overshoots by x{(G + b_noise) / (b + b_noise):.2f})"
    )
    return "; ".join([head, *others, noise])
