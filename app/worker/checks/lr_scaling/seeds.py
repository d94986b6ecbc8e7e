"""A rule's outcome over the probe's seeds (verdict.py words it): each seed's final held-out
loss against the same seed's base run (the pair shares its initialisation and its samples, so
their difference is the rule's and not the draw's), the mean ratio and its spread, whether the
seeds agree about the tolerance (`borderline` where they do not), and which rules the best one
beats in every seed (the others are tied with it).

One seed decided the answer before: a base run's held-out loss moved 2.4x across seeds, far
beyond a 5 % tolerance, so a verdict that one draw put on one side of it flipped with the next.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from app.contract.kinds.lr_scaling import LrScalingSpec, ProbeRule


@dataclass(frozen=True, slots=True)
class Seeded:
    ratios: tuple[float | None, ...]  # each seed's final loss over its base run's
    mean: float | None  # None: a seed diverged
    spread: float | None  # the seeds' standard deviation (0 with one seed)
    outcome: str  # "holds", "fails" or "borderline"


def passes(probe: LrScalingSpec, final: float | None, base: float | None, higher: bool = False) -> bool:
    """Whether one seed's run ends within the tolerance of its base run, in the tolerance's unit
    (nats: absolute, in the metric's own units where a factory's metric judges); `higher`: a
    metric that is better higher (accuracy), which may end at most the tolerance below."""
    if final is None or not base:
        return False
    if higher:
        floor = base - probe.tolerance if probe.tolerance_unit == "nats" else base * (1 - probe.tolerance)
        return final >= floor
    if probe.tolerance_unit == "nats":
        return final - base <= probe.tolerance
    return final / base <= 1 + probe.tolerance


def over_seeds(
    probe: LrScalingSpec, finals: list[float | None], bases: list[float | None], higher: bool = False
) -> Seeded:
    ratios = tuple(None if f is None or not b else f / b for f, b in zip(finals, bases, strict=True))
    held = [passes(probe, f, b, higher) for f, b in zip(finals, bases, strict=True)]
    outcome = "holds" if all(held) else "fails" if not any(held) else "borderline"
    finite = [r for r in ratios if r is not None]
    if len(finite) < len(ratios):
        return Seeded(ratios, None, None, outcome)
    spread = statistics.stdev(finite) if len(finite) > 1 else 0.0
    return Seeded(ratios, statistics.fmean(finite), spread, outcome)


def relative_threshold(probe: LrScalingSpec, base_final: float | None) -> float:
    """Half the tolerance as a relative fall an interval (a tolerance in nats over the base run's
    final loss): at that pace two more intervals move a rule by the whole tolerance."""
    if probe.tolerance_unit == "nats":
        return probe.tolerance / 2 / base_final if base_final else float("inf")
    return probe.tolerance / 2


def judged_ratio(rule: ProbeRule) -> float | None:
    """The mean ratio the verdict judges by: the metric's where a factory's metric judges."""
    return rule.metric_ratio if rule.metric is not None else rule.final_loss_ratio


def best_of(rules: list[ProbeRule], higher: bool = False) -> tuple[str, tuple[str, ...]]:
    """The rule with the best mean ratio (the lowest; the highest for a metric better higher),
    and every rule it does not beat in every seed (a seed that diverged loses to one that did
    not)."""
    sign = -1.0 if higher else 1.0
    finite = [r for r in rules if judged_ratio(r) is not None]
    if not finite:
        return rules[0].rule, tuple(r.rule for r in rules)
    best = min(finite, key=lambda r: sign * (judged_ratio(r) or 0.0))

    def beaten(other: ProbeRule) -> bool:
        return all(
            mine is not None and (theirs is None or sign * mine < sign * theirs)
            for mine, theirs in zip(best.seed_ratios, other.seed_ratios, strict=True)
        )

    return best.rule, (best.rule, *(r.rule for r in rules if r is not best and not beaten(r)))
