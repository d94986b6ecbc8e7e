"""The probe's noise scale read against its measured outcome (verdict.py puts it in the verdict):
which of the three measurements along the base run the regime and McCandlish et al. 2018's
prediction use, and whether that prediction agrees with what linear scaling measured.

McCandlish et al.: the best SGD lr at batch B is eps_max / (1 + B_noise / B), so the linear rule
from a base batch b overshoots it by (B + B_noise) / (b + B_noise): about 1 (linear holds) while
B is well below B_noise, about B / B_noise (a larger lr does not help) well above it. The noise
scale grows as the loss falls (issue 47's language model: 1.5 at the initial weights, 95 to 131
along the run), so the start misreads a run that spends its steps past it: the prediction is
read halfway, else at the end, else at the start. The prediction also assumes the base lr is the
best at the base batch: below it, a larger lr gains more than the noise scale allows.
"""

from __future__ import annotations

from app.contract.kinds.lr_scaling import ProbeNoise, ProbeRule

HOLDS_BELOW = 1.5  # an overshoot under this: the prediction is that linear holds
OVERSHOOTS_FROM = 2.0  # from this on: that linear overshoots the best lr


NoiseAlong = tuple[float | None, float | None, float | None]  # start, middle, end
WhyNot = tuple[str | None, str | None, str | None]  # why each is None, where it is
PLACES = ("start", "middle", "end")


def read_noise(measured: NoiseAlong, G: int, b: int, why: WhyNot = (None, None, None)) -> ProbeNoise:
    start, middle, end = measured
    used, value = next(
        ((name, v) for name, v in (("middle", middle), ("end", end), ("start", start)) if v is not None),
        (None, None),
    )
    return ProbeNoise(
        start=start,
        middle=middle,
        end=end,
        used=used,
        batch_to_noise=None if value is None else G / value,
        linear_overshoot=None if value is None else (G + value) / (b + value),
        unmeasured=tuple(
            f"{place}: {reason}"
            for place, v, reason in zip(PLACES, measured, why, strict=True)
            if v is None and reason
        ),
    )


def used_value(noise: ProbeNoise) -> float | None:
    return {"start": noise.start, "middle": noise.middle, "end": noise.end}.get(noise.used or "")


def agrees(noise: ProbeNoise, rules: list[ProbeRule]) -> bool | None:
    """Whether the prediction for linear matches linear's measured outcome; None where either
    says nothing clear (no linear run, a borderline outcome, an overshoot between 1.5 and 2)."""
    linear = next((r for r in rules if r.rule == "linear"), None)
    x = noise.linear_overshoot
    if linear is None or x is None or linear.outcome == "borderline":
        return None
    if x < HOLDS_BELOW:
        return linear.holds
    if x >= OVERSHOOTS_FROM:
        return not linear.holds
    return None


def noise_words(noise: ProbeNoise, G: int, found: str) -> str:
    """The verdict's clause on the noise scale: the value used, where along the run, the others."""
    value = used_value(noise)
    if value is None:
        because = f" ({'; '.join(noise.unmeasured)})" if noise.unmeasured else ""
        return f"the noise scale could not be measured{because}"
    others = [
        f"{v:,.3g} at the {name}"
        for name, v in (("start", noise.start), ("middle", noise.middle), ("end", noise.end))
        if v is not None and name != noise.used
    ]
    where = {"middle": "halfway through the base run", "end": "at its end", "start": "at its start"}
    return (
        f"B_noise ~ {value:,.3g} ({where[noise.used or 'start']}{'; ' if others else ''}{', '.join(others)}) "
        f"puts {G:,} {found.replace('_', ' ')} (McCandlish et al. predict linear overshoots by "
        f"x{noise.linear_overshoot or 0:.2f})"
    )


def disagreement(noise: ProbeNoise, rules: list[ProbeRule], verdict: bool | None) -> str:
    """The verdict's sentence where measurement and prediction disagree, with the likely cause."""
    linear = next((r for r in rules if r.rule == "linear"), None)
    if verdict is not False or linear is None:
        return ""
    x = noise.linear_overshoot or 0.0
    if linear.holds:
        return (
            f"; measurement and prediction disagree: linear holds although McCandlish et al. predict it "
            f"overshoots the best lr by x{x:.2f}; the likely cause: base_lr is below its best at the base "
            "batch (the prediction assumes it is the best), so a larger lr gains more than the noise "
            "scale allows"
        )
    cause = (
        "its runs were still falling when the probe stopped (probe longer)"
        if linear.still_falling
        else "base_lr is near the largest stable lr, so scaling it up overshoots whatever the noise scale"
    )
    return (
        f"; measurement and prediction disagree: linear fails although McCandlish et al. predict it "
        f"stays near the best lr (x{x:.2f}); the likely cause: {cause}"
    )
