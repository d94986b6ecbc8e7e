"""The lr-scaling probe's judgement (probe.py trains the runs): each rule's final held-out
loss over its seed's base run's and its outcome over the seeds (seeds.py), the best rule, the
runs still falling when the probe stopped, the regime McCandlish et al. 2018 predict from the
noise scale along the base run and whether it agrees (noise_reading.py), and one sentence.
The regime reads the global batch against the B_noise used: below B_noise / 4, within a factor
4 of it, or above 4 x B_noise.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from app.contract.kinds.lr_scaling import (
    LossPoint,
    LrScalingResult,
    LrScalingSpec,
    ProbeBase,
    ProbeRule,
    ProbeRunSpec,
)
from app.worker.checks.lr_scaling.noise_reading import (
    NoiseAlong,
    WhyNot,
    agrees,
    disagreement,
    noise_words,
    read_noise,
    used_value,
)
from app.worker.checks.lr_scaling.seeds import best_of, over_seeds, relative_threshold

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


def last_interval_fall(curve: LossCurve) -> float | None:
    """How far the held-out loss fell over the curve's last interval, relative to where that
    interval started (negative: it rose); None where either end is missing."""
    if len(curve) < 2:
        return None
    before, last = curve[-2][1], curve[-1][1]
    if before is None or last is None or before <= 0:
        return None
    return (before - last) / before


def still_falling(fall: float | None, base_fall: float | None, threshold: float) -> bool:
    """Falling faster than the base run by over `threshold` (half the tolerance) an interval: at
    that pace two more intervals move its ratio by the whole tolerance, so it is not settled."""
    return fall is not None and base_fall is not None and fall - base_fall > threshold


def settling(
    probe: LrScalingSpec, b: int, rules: list[ProbeRule], best: str
) -> tuple[tuple[str, ...], int | None]:
    """The still-falling rules whose outcome a longer probe could change (one that fails could
    come to hold, one behind the best could overtake it), and the length that would settle them:
    as many steps at the global batch as the base run took here (G / b times the samples, at
    least twice), no further than the plan's whole run. None at the whole run: real training
    stops there too."""
    if probe.whole_run is not None and probe.samples >= probe.whole_run:
        return (), None
    changing = tuple(r.rule for r in rules if r.still_falling and (not r.holds or r.rule != best))
    if not changing:
        return (), None
    G = probe.global_batch_size
    longer = probe.samples * max(2, -(-G // b))
    if probe.whole_run is not None:
        longer = min(longer, probe.whole_run)
    return changing, longer


Trained = list[list[tuple[ProbeRunSpec, LossCurve]]]  # per seed: the base run first, then the rules


@dataclass(frozen=True, slots=True)
class Judged:
    """The factory's referee's say: its metric's name, its direction, and every run's final
    value on the factory's held-out set (per seed: the base run first, then the rules)."""

    name: str
    higher_is_better: bool
    finals: list[list[float | None]]

    def mean(self, i: int) -> float | None:
        values = [seed[i] for seed in self.finals]
        return None if any(v is None for v in values) else statistics.fmean(v or 0.0 for v in values)


def _rule(
    probe: LrScalingSpec, i: int, trained: Trained, bases: list[LossCurve], judged: Judged | None
) -> ProbeRule:
    """Rule i's runs over the seeds, each against its seed's base run: by the held-out loss, or
    by the factory's metric with the loss beside it."""
    run, curve = trained[0][i]
    curves = [seed[i][1] for seed in trained]
    by_loss = over_seeds(probe, [c[-1][1] for c in curves], [c[-1][1] for c in bases])
    seeded = by_loss
    if judged is not None:
        finals, base_finals = [s[i] for s in judged.finals], [s[0] for s in judged.finals]
        seeded = over_seeds(probe, finals, base_finals, judged.higher_is_better)
    falls = [last_interval_fall(c) for c in curves]
    falling = any(
        still_falling(fall, last_interval_fall(base), relative_threshold(probe, base[-1][1]))
        for fall, base in zip(falls, bases, strict=True)
    )
    return ProbeRule(
        rule=run.rule,
        lr=run.recipe.lr,
        curve=_points(curve),
        final_loss_ratio=by_loss.mean,
        holds=seeded.outcome == "holds",
        last_interval_fall=falls[0],
        still_falling=falling,
        seed_ratios=seeded.ratios,
        ratio_spread=seeded.spread,
        outcome=seeded.outcome,
        metric=None if judged is None else judged.mean(i),
        metric_ratio=None if judged is None else seeded.mean,
    )


def judge(
    probe: LrScalingSpec,
    trained: Trained,
    noise: NoiseAlong,
    judged: Judged | None = None,
    why: WhyNot = (None, None, None),
) -> LrScalingResult:
    """The result from every seed's runs (each seed's base run first), judged by the held-out
    loss or, with `judged`, by the factory's metric."""
    base_run, base_curve = trained[0][0]
    bases = [seed[0][1] for seed in trained]
    base_finals = tuple(c[-1][1] for c in bases)
    rules = [_rule(probe, i, trained, bases, judged) for i in range(1, len(trained[0]))]
    best, tied = best_of(rules, judged is not None and judged.higher_is_better)
    changing, longer = settling(probe, base_run.batch_size, rules, best)
    plan_holds = next(r.holds for r in rules if r.rule == probe.plan_rule)
    G, b = probe.global_batch_size, base_run.batch_size
    noise_scale = read_noise(noise, G, b, why)
    found = regime(G, used_value(noise_scale))
    agree = agrees(noise_scale, rules)
    base_fall = last_interval_fall(base_curve)
    words = noise_words(noise_scale, G, found)
    head = (
        verdict(probe, b, rules, best, words)
        if judged is None
        else metric_verdict(probe, b, rules, best, judged) + "; " + words
    )
    sentence = (
        head + disagreement(noise_scale, rules, agree) + _seeds(probe, rules, tied)
        + _unsettled(rules, changing, longer, base_fall)
        if all(base_finals)
        else _base_diverged(probe, base_run)
    )  # fmt: skip
    base_metric = None if judged is None else judged.mean(0)
    return LrScalingResult(
        samples=probe.samples,
        global_batch_size=G,
        length=probe.length,
        tolerance=probe.tolerance,
        tolerance_unit=probe.tolerance_unit,
        seeds=probe.seeds,
        label_noise=probe.label_noise,
        base=ProbeBase(b, base_run.recipe.lr, _points(base_curve), base_fall, base_finals, base_metric),
        rules=tuple(rules),
        best_rule=best,
        tied_for_best=tied,
        plan_rule=probe.plan_rule,
        plan_rule_holds=plan_holds,
        noise_scale=noise_scale,
        regime=found,
        prediction_agrees=agree,
        could_change=changing,
        settling_samples=longer,
        verdict=sentence,
        metric_name=None if judged is None else judged.name,
        higher_is_better=None if judged is None else judged.higher_is_better,
    )


def _base_diverged(probe: LrScalingSpec, base: ProbeRunSpec) -> str:
    return (
        f"the base run ({base.batch_size:,} at lr {base.recipe.lr:.4g}) diverges over {probe.samples:,} "
        f"samples{' in a seed' if probe.seeds > 1 else ''}, so no rule can be held against it: lower "
        "base_lr (or probe fewer samples) and probe again"
    )


def _seeds(probe: LrScalingSpec, rules: list[ProbeRule], tied: tuple[str, ...]) -> str:
    """The verdict's words on the seeds: the rules the best does not beat in every seed, and the
    rules whose seeds fall on both sides of the tolerance."""
    if probe.seeds == 1:
        return ""
    words = [f"over {probe.seeds} seeds (each rule against its seed's base run)"]
    if len(tied) > 1:
        words.append(f"tied for best within the seeds' spread: {', '.join(tied)}")
    for r in rules:
        if r.outcome == "borderline":
            finite = [x for x in r.seed_ratios if x is not None]
            low, high = (min(finite), max(finite)) if finite else (0.0, 0.0)
            words.append(f"{r.rule} is borderline (seeds {low:.3f} to {high:.3f} of the base run)")
    return "; " + "; ".join(words)


def _unsettled(
    rules: list[ProbeRule], changing: tuple[str, ...], longer: int | None, base: float | None
) -> str:
    """The verdict's warning where runs were still falling when the probe stopped."""
    if not changing or longer is None:
        return ""
    falls = ", ".join(
        f"{r.rule} fell {(r.last_interval_fall or 0) * 100:.1f} %" for r in rules if r.rule in changing
    )
    return (
        f"; still falling when the probe stopped ({falls} over the last interval, the base run "
        f"{(base or 0) * 100:.1f} %), so {', '.join(changing)} could still change: probe {longer:,} samples "
        "to settle it"
    )


def tolerance_words(probe: LrScalingSpec) -> str:
    if probe.tolerance_unit == "nats":
        return f"{probe.tolerance:g} nats"
    return f"{probe.tolerance * 100:g} %"


def _percent(ratio: float) -> str:
    return f"{abs(ratio - 1) * 100:.1f} %"


def _standing(rule: ProbeRule) -> str:
    ratio = rule.final_loss_ratio
    if ratio is None:
        return f"{rule.rule} (lr {rule.lr:.4g}) diverges"
    if rule.outcome == "borderline":
        return f"{rule.rule} (lr {rule.lr:.4g}) lags by {_percent(ratio)} on average"
    if ratio >= 1:
        return f"{rule.rule} (lr {rule.lr:.4g}) lags by {_percent(ratio)}"
    return f"{rule.rule} (lr {rule.lr:.4g}) ends {_percent(ratio)} below it"


def verdict(probe: LrScalingSpec, b: int, rules: list[ProbeRule], best: str, noise: str) -> str:
    """One sentence in the user's numbers: the best rule against the base run, then the others."""
    G, samples = probe.global_batch_size, probe.samples
    top = next(r for r in rules if r.rule == best)
    ratio = top.final_loss_ratio
    over = "the whole run's" if probe.length == "whole_run" else ""
    run = f"the {b:,}-sample run over {over}{' ' if over else ''}{samples:,} samples"
    if ratio is None:
        head = f"at {G:,}, every rule diverges against {run}"
    elif ratio <= 1:
        head = f"at {G:,}, {best} scaling to {top.lr:.4g} ends {_percent(ratio)} below {run}"
    elif top.holds:
        head = f"at {G:,}, {best} scaling to {top.lr:.4g} keeps the loss within {_percent(ratio)} of {run}"
    else:
        head = (
            f"at {G:,}, no rule holds: the best, {best} scaling to {top.lr:.4g}, lags {run} by "
            f"{_percent(ratio)} (tolerance {tolerance_words(probe)})"
        )
    others = [_standing(r) for r in rules if r.rule != best]
    return "; ".join([head, *others, noise])


def metric_verdict(probe: LrScalingSpec, b: int, rules: list[ProbeRule], best: str, judged: Judged) -> str:
    """The sentence where the factory's metric judges: each rule's metric against the base
    run's, its outcome, and its held-out loss ratio beside it."""
    base = judged.mean(0)
    direction = "higher" if judged.higher_is_better else "lower"
    head = (
        f"at {probe.global_batch_size:,}, by the factory's {judged.name} on its held-out set ({direction} is "
        f"better, tolerance {tolerance_words(probe)}), against the {b:,}-sample run's "
        f"{'?' if base is None else f'{base:.4g}'} over {probe.samples:,} samples: best {best}"
    )

    def standing(r: ProbeRule) -> str:
        value = "diverges" if r.metric is None else f"{r.metric:.4g}"
        loss = "" if r.final_loss_ratio is None else f", held-out loss x{r.final_loss_ratio:.3g}"
        return f"{r.rule} (lr {r.lr:.4g}) {value}: {r.outcome}{loss}"

    return "; ".join([head, *(standing(r) for r in rules)])
