"""What an lr-scaling probe runs (`POST /v1/checks` with `lr_scaling`): the base run and one
run per rule, each with its own recipe, built from the plan request and refused at the field
to change. Pure (standard library and the core): the web process builds it, every rank reads it
(checks/lr_scaling_probe.py trains it).

Each rule's recipe is the plan's own recipe planned again with that rule: its scaled lr, its
warmup from `warmup_start_lr`, its decay, and (Adam with the square-root rule) Malladi et al.'s
betas and eps. The base run is rule `none` (`base_lr`) at `base_batch_size`. Every run counts
the schedule in samples: a run at batch b takes its step j at the lr of the plan's optimizer
step (j x b) // global batch, so the warmup and the decay cover the same samples at every batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from app.contract.limits import within
from app.contract.options import LrScalingOptions
from app.core.errors.domain import InvalidValue, PlanError, field_key
from app.core.planner import plan
from app.core.records.plan import LearningRatePlan, Plan
from app.core.records.plan_request import LRRule, PlanRequest

RULES: tuple[str, ...] = (LRRule.NONE.value, LRRule.SQRT.value, LRRule.LINEAR.value)
_FIELD = "/lr_scaling/"


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
    points: tuple[int, ...]  # the sample counts every run is evaluated at (0 first)
    tolerance: float
    label_noise: float
    plan_rule: str  # the rule the plan scales by
    base: ProbeRunSpec
    runs: tuple[ProbeRunSpec, ...]


def probe_spec(request: PlanRequest, planned: Plan, options: LrScalingOptions) -> LrScalingSpec:
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
    if options.samples < least:
        pointer = _FIELD + "samples"
        raise InvalidValue(
            f"samples {options.samples} is less than one optimizer step of the "
            f"{'global batch' if G >= b else 'base batch'} ({least}): every run trains the same samples; "
            f"give at least {least}, better {max(64 * G, least):,} or more",
            pointer=pointer,
            suggestions={field_key(pointer): [least, 64 * least]},
        )
    rules = _rules(options.rules, lr.rule)
    steps = options.samples // G
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
        points=points,
        tolerance=options.tolerance,
        label_noise=options.label_noise,
        plan_rule=lr.rule,
        base=base,
        runs=runs,
    )


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
