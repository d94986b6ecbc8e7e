"""An lr-scaling probe (`POST /v1/checks` with `lr_scaling`), the contract half: the options
(`LrScalingOptions`), what the probe runs (`LrScalingSpec`: the base run and one run per rule,
each with its own recipe, built from the plan request and refused at the field to change), and
its answer (`LrScalingResult`). Pure (standard library and the core): the web process builds
it, every rank reads it (checks/lr_scaling trains it).

Each rule's recipe is the plan's own recipe planned again with that rule: its scaled lr, its
warmup from `warmup_start_lr`, its decay, and (Adam with the square-root rule) Malladi et al.'s
betas and eps. The base run is rule `none` (`base_lr`) at `base_batch_size`. Every run counts
the schedule in samples: a run at batch b takes its step j at the lr of the plan's optimizer
step (j x b) // global batch, so the warmup and the decay cover the same samples at every batch.

Over 300 lines: one concept, the probe's contract (its options, what it runs and its answer),
which the web process and every rank read together.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from app.contract.check_options import (
    DEFAULT_LR_PROBE_NATS,
    DEFAULT_LR_PROBE_POINTS,
    DEFAULT_LR_PROBE_SEEDS,
    DEFAULT_LR_PROBE_TOLERANCE,
    MAX_LR_PROBE_SAMPLES,
)
from app.contract.kinds.part import RequestPart, Trained
from app.contract.limits import within
from app.contract.model_registry import SYNTHETIC
from app.contract.spec_error import SpecError
from app.core.errors.domain import InvalidValue, PlanError, field_key
from app.core.planner import plan
from app.core.records.plan import LearningRatePlan, Plan
from app.core.records.plan_request import LRRule, PlanRequest

if TYPE_CHECKING:
    from app.contract.request import CheckRequest
    from app.contract.spec import CheckSpec

RULES: tuple[str, ...] = (LRRule.NONE.value, LRRule.SQRT.value, LRRule.LINEAR.value)
_FIELD = "/lr_scaling/"


@dataclass(frozen=True, slots=True)
class LrScalingOptions:
    """An lr-scaling probe: train `samples` samples (or `epochs` of the plan's dataset; neither:
    the plan's whole run) at the base batch and, per rule, at the plan's global batch, from
    `seeds` initialisations and sample streams, evaluating at `points` sample counts; a rule
    holds while its final held-out loss is within `tolerance` of the base run's, in
    `tolerance_unit` (None: relative 0.05, or 0.02 nats for the tokens workload's cross-entropy).
    `label_noise`: the standard deviation of Gaussian noise added to the built-in model's
    targets (its gradient noise knob)."""

    samples: int | None = None
    rules: tuple[str, ...] | None = None  # None: none, sqrt, linear and the plan's own
    points: int = DEFAULT_LR_PROBE_POINTS
    tolerance: float | None = None
    label_noise: float = 0.0
    epochs: float | None = None
    seeds: int = DEFAULT_LR_PROBE_SEEDS
    tolerance_unit: str | None = None  # "relative" or "nats"


@dataclass(frozen=True, slots=True)
class ProbeRunSpec:
    """One run of the probe: `rule` ("base" for the base run) at `batch_size` with `recipe`."""

    rule: str
    batch_size: int
    recipe: LearningRatePlan


@dataclass(frozen=True, slots=True)
class LrScalingSpec:
    samples: int  # what every run trains: a whole number of the plan's global batches
    global_batch_size: int
    length: str  # where `samples` came from: "samples", "epochs" or "whole_run"
    whole_run: int | None  # the plan's whole run in samples, where it states one
    points: tuple[int, ...]  # the sample counts every run is evaluated at (0 first)
    tolerance: float
    tolerance_unit: str  # "relative" (final / base <= 1 + tolerance) or "nats" (final - base)
    seeds: int  # each run from this many initialisations and streams, paired with its seed's base
    label_noise: float
    plan_rule: str  # the rule the plan scales by
    base: ProbeRunSpec
    runs: tuple[ProbeRunSpec, ...]


class LrScalingPart(RequestPart):
    """`lr_scaling`: the probe every rank's spec carries (`CheckSpec.lr_scaling`)."""

    option: ClassVar[str] = "lr_scaling"

    def apply(self, request: CheckRequest, trained: Trained, spec: CheckSpec) -> CheckSpec:
        asked = request.options.lr_scaling
        if asked is None:
            return spec
        # label_noise moves the built-in model's noise only.
        if asked.label_noise and (spec.model != SYNTHETIC or spec.workload == "tokens"):
            raise SpecError(
                "label_noise is the built-in model's knob (noise on its synthetic targets): send it 0 with "
                "a registered model or the tokens workload",
                "/lr_scaling/label_noise",
            )
        if request.options.steps > 1:
            raise SpecError(
                "an lr-scaling probe trains its own runs: send steps 1 with lr_scaling, or check the run "
                "without it",
                "/steps",
            )
        nats = spec.workload == "tokens"
        return dataclasses.replace(spec, lr_scaling=probe_spec(request.plan, trained.plan, asked, nats=nats))


def probe_spec(
    request: PlanRequest, planned: Plan, options: LrScalingOptions, *, nats: bool = False
) -> LrScalingSpec:
    """The probe of `planned` (the plan of `request`); raises InvalidValue at the field."""
    lr = planned.learning_rate
    if lr is None or request.learning_rate is None:
        raise InvalidValue(
            "an lr-scaling probe measures how the plan's learning rate scales, and this plan has none: "
            'give plan.learning_rate, e.g. {"base_lr": 0.1, "base_batch_size": 64}',
            pointer="/plan/learning_rate",
        )
    within(options, "lr_scaling")  # the ranges the HTTP schema holds, for JSON it did not read
    G, b = planned.global_batch_size, lr.base_batch_size
    least = max(G, b)
    whole = lr.train_steps * G if lr.train_steps else None
    samples, length = _length(request, options, whole)
    if samples < least:
        pointer = _FIELD + ("epochs" if length == "epochs" else "samples")
        better = whole if whole is not None and whole >= least else 64 * least
        raise InvalidValue(
            f"{length.replace('_', ' ')} of {samples} samples is less than one optimizer step of the "
            f"{'global batch' if G >= b else 'base batch'} ({least}): every run trains the same samples; "
            f"give samples of at least {least}, better {_better(whole, least)}",
            pointer=pointer,
            suggestions={field_key(_FIELD + "samples"): [least, better]},
        )
    rules = _rules(options.rules, lr.rule)
    tolerance, unit = _tolerance(options, nats)
    steps = samples // G
    trained = steps * G
    points = (
        0,
        *sorted({max(1, round(i * steps / options.points)) * G for i in range(1, options.points + 1)}),
    )
    base = ProbeRunSpec("base", b, _recipe(request, LRRule.NONE.value))
    runs = tuple(ProbeRunSpec(rule, G, _recipe(request, rule)) for rule in rules)
    return LrScalingSpec(
        samples=trained,
        global_batch_size=G,
        length=length,
        whole_run=whole,
        points=points,
        tolerance=tolerance,
        tolerance_unit=unit,
        seeds=options.seeds,
        label_noise=options.label_noise,
        plan_rule=lr.rule,
        base=base,
        runs=runs,
    )


def _length(request: PlanRequest, options: LrScalingOptions, whole: int | None) -> tuple[int, str]:
    """How far every run trains, and why: the samples or epochs asked for, else the whole run."""
    if options.samples is not None and options.epochs is not None:
        raise InvalidValue(
            "give samples or epochs, not both: each says how far every run trains",
            pointer=_FIELD + "epochs",
        )
    if options.samples is not None:
        return options.samples, "samples"
    if options.epochs is not None:
        if request.dataset is None:
            raise InvalidValue(
                "epochs counts passes over plan.dataset, and this plan has none: give plan.dataset "
                '({"num_samples": ...}) or lr_scaling.samples',
                pointer=_FIELD + "epochs",
            )
        return round(options.epochs * request.dataset.num_samples), "epochs"
    if whole is None:
        pointer = _FIELD + "samples"
        raise InvalidValue(
            "the probe trains the plan's whole run unless told, and this plan states no length: give "
            "plan.learning_rate.train_steps (or plan.dataset with epochs), or lr_scaling.samples",
            pointer=pointer,
        )
    if whole > MAX_LR_PROBE_SAMPLES:
        pointer = _FIELD + "samples"
        raise InvalidValue(
            f"the plan's whole run is {whole:,} samples, more than a probe trains "
            f"({MAX_LR_PROBE_SAMPLES:,}): give lr_scaling.samples (a shorter probe says which rules were "
            "still falling when it stopped)",
            pointer=pointer,
            suggestions={field_key(pointer): [MAX_LR_PROBE_SAMPLES]},
        )
    return whole, "whole_run"


def _tolerance(options: LrScalingOptions, nats: bool) -> tuple[float, str]:
    """The tolerance and its unit: absolute nats for a cross-entropy (the tokens workload),
    whose floor is far from zero; relative for a loss that falls towards zero."""
    unit = options.tolerance_unit or ("nats" if nats else "relative")
    if unit not in ("relative", "nats"):
        raise InvalidValue(
            f"tolerance_unit {unit!r} is not one the probe knows: relative (a loss falling towards "
            "zero) or nats (a cross-entropy)",
            pointer=_FIELD + "tolerance_unit",
        )
    if options.tolerance is not None:
        return options.tolerance, unit
    return (DEFAULT_LR_PROBE_NATS if unit == "nats" else DEFAULT_LR_PROBE_TOLERANCE), unit


def probe_cost(probe: LrScalingSpec) -> float:
    """The probe's training work in sample-steps of the built-in model's cost: every run of every
    seed, a step costing a fixed overhead (64 samples' worth) and its samples, the base run's
    noise measurement half its training again. What the ranks share out (checks/lr_scaling), and
    what an admission estimate multiplies by a measured time per unit."""
    return probe.seeds * sum(run_cost(probe, run) for run in (probe.base, *probe.runs))


def run_cost(probe: LrScalingSpec, run: ProbeRunSpec) -> float:
    """One run of one seed in probe_cost's units."""
    steps = probe.samples / run.batch_size
    return steps * (1 + run.batch_size / 64) * (1.5 if run.rule == "base" else 1.0)


def _better(whole: int | None, least: int) -> str:
    """The refusal's advice: the whole run, where near convergence a shorter probe misleads."""
    if whole is not None and whole >= least:
        return f"the plan's whole run, {whole:,} (leave samples out)"
    return f"the run's length (plan.learning_rate.train_steps x the global batch), or {64 * least:,} or more"


def _rules(asked: tuple[str, ...] | None, plan_rule: str) -> tuple[str, ...]:
    """The rules asked for (default none, sqrt, linear), each once, and the plan's own."""
    for i, rule in enumerate(asked or ()):
        if rule not in RULES:
            raise InvalidValue(
                f"rule {rule!r} is not one the probe runs: it runs {', '.join(RULES)} "
                f"(the plan's own, {plan_rule}, is added when missing)",
                pointer=f"{_FIELD}rules/{i}",
            )
    chosen = list(dict.fromkeys(asked or RULES))
    if plan_rule not in chosen:
        chosen.append(plan_rule)
    return tuple(chosen)


def _recipe(request: PlanRequest, rule: str) -> LearningRatePlan:
    """The plan's recipe under `rule`; a warmup start or floor above that rule's lr is lowered
    to it (the plan refuses them above its own lr)."""
    spec = request.learning_rate
    assert spec is not None
    asked = dataclasses.replace(spec, rule=LRRule(rule), lr_scaling=None, lr_scaling_check=None)
    try:
        recipe = plan(dataclasses.replace(request, learning_rate=asked)).learning_rate
    except PlanError:
        lowered = dataclasses.replace(asked, warmup_start_lr=None, min_lr=None)
        try:
            recipe = plan(dataclasses.replace(request, learning_rate=lowered)).learning_rate
        except PlanError as err:
            raise err.under("/plan") from None
    assert recipe is not None
    return recipe


@dataclass(frozen=True, slots=True)
class LossPoint:
    """A run's loss on the probe's held-out batch after `samples` training samples (None: the
    run diverged before)."""

    samples: int
    loss: float | None


@dataclass(frozen=True, slots=True)
class ProbeBase:
    """The lr-scaling probe's base run: the plan's base_batch_size at base_lr."""

    batch_size: int
    lr: float
    curve: tuple[LossPoint, ...]  # the first seed's
    last_interval_fall: float | None  # relative fall of its loss over the last interval
    final_losses: tuple[float | None, ...]  # each seed's
    metric: float | None = None  # the factory's metric at its end, the mean over seeds (its referee)


@dataclass(frozen=True, slots=True)
class ProbeRule:
    """One rule's runs at the plan's global batch: their final held-out loss over the same
    seed's base run's (the mean over seeds; None: a seed diverged) and its spread, the outcome
    against the probe's tolerance (`borderline` where seeds fall on both sides of it), and
    whether a seed was still falling at the end (its last interval's fall beyond the base
    run's). Where the factory gives a referee, `seed_ratios`, the spread and the outcome are its
    metric's, with `final_loss_ratio` beside them."""

    rule: str
    lr: float
    curve: tuple[LossPoint, ...]  # the first seed's
    final_loss_ratio: float | None
    holds: bool
    last_interval_fall: float | None  # the first seed's
    still_falling: bool
    seed_ratios: tuple[float | None, ...]
    ratio_spread: float | None  # the seeds' standard deviation (0 with one seed)
    outcome: str  # "holds", "fails" or "borderline"
    metric: float | None = None  # the factory's metric at its end, the mean over seeds
    metric_ratio: float | None = None  # the mean of seed_ratios where the metric judges


@dataclass(frozen=True, slots=True)
class ProbeNoise:
    """The gradient noise scale B_simple along the first seed's base run: at its start, halfway
    and at its end; `used`, the one the regime and McCandlish et al.'s prediction are read from
    (halfway: where the run spends its steps, and the noise scale grows as the loss falls; else
    the end, else the start), and the global batch against it."""

    start: float | None
    middle: float | None
    end: float | None
    used: str | None  # "middle", "end" or "start"; None: none was measurable
    batch_to_noise: float | None  # global batch / B_noise
    linear_overshoot: float | None  # McCandlish et al.: (B + B_noise) / (b + B_noise)
    unmeasured: tuple[str, ...] = ()  # why a value is None: "end: ...", one line each


@dataclass(frozen=True, slots=True)
class LrScalingResult:
    """An lr-scaling probe's answer (`result.lr_scaling`), as a plan takes it back."""

    samples: int
    global_batch_size: int
    length: str  # "samples", "epochs" or "whole_run": where `samples` came from
    tolerance: float
    tolerance_unit: str
    seeds: int
    label_noise: float
    base: ProbeBase
    rules: tuple[ProbeRule, ...]
    best_rule: str  # the lowest mean: what a plan given the result scales by
    tied_for_best: tuple[str, ...]  # best_rule and every rule it does not beat in every seed
    plan_rule: str
    plan_rule_holds: bool
    noise_scale: ProbeNoise
    regime: str  # below_noise_scale, around_noise_scale, above_noise_scale or unknown
    prediction_agrees: bool | None  # McCandlish et al.'s prediction against linear's measured outcome
    could_change: tuple[str, ...]  # rules still falling whose outcome a longer probe could change
    settling_samples: int | None  # the length that would settle them (None: nothing to settle)
    verdict: str
    # The factory's metric that judged (its referee: docs/your-own-model.md); None: the held-out loss.
    metric_name: str | None = None
    higher_is_better: bool | None = None
