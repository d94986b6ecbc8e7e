"""What the plan's learning-rate rule rests on (issue 39): a measurement, when the request gives
an lr-scaling probe's result back (`learning_rate.rule: "measured"` with `lr_scaling`, or with
`lr_scaling_check`, the probe's check id, which a server looks up and fills in), or else an
assumption, which the explanation says, with how to measure it. And the warning for a large
scale-up without warmup: Goyal et al. 2017 held linear scaling to a batch of 8k on ImageNet only
with a gradual warmup.

The probe (`POST /v1/checks` with `lr_scaling`) trains, from one initialisation on one sample
stream, the base run at `base_batch_size` and `base_lr` and the plan's global batch at each
rule's lr, for the same number of samples, and names the rule whose run comes closest to the
base run (`best_rule`)."""

from __future__ import annotations

import math

from app.core.errors.domain import InvalidValue
from app.core.records.plan import LearningRatePlan, MeasuredRule
from app.core.records.plan_request import LearningRateSpec, LRRule, ProbeRun

# The probe's rule names the plan can scale by.
PLAN_RULES = {"linear": LRRule.LINEAR, "sqrt": LRRule.SQRT, "none": LRRule.NONE}
WARMUP_FACTOR = 4.0  # a scale-up from which a missing warmup is warned about
_LR = "/learning_rate/"
HOW_TO_MEASURE = (
    "send POST /v1/checks with lr_scaling (batchplan check --lr-scaling SAMPLES), which trains the "
    "base run and each rule's run at this global batch for the same samples, then plan with "
    'learning_rate.rule "measured" and the probe\'s check id (lr_scaling_check) or its result '
    "(lr_scaling)"
)


def measured_rule(spec: LearningRateSpec) -> tuple[LRRule, MeasuredRule, list[str]] | None:
    """Under rule "measured", the probe's best rule, what the plan states of it, and warnings;
    None under another rule. Refusals name the field at fault."""
    probe = spec.lr_scaling
    if spec.rule is not LRRule.MEASURED:
        if probe is not None or spec.lr_scaling_check is not None:
            given = "lr_scaling" if probe is not None else "lr_scaling_check"
            raise InvalidValue(
                f"{given} is an lr-scaling probe's result, read under rule \"measured\"; this plan's "
                f"rule is {spec.rule.value}: set learning_rate.rule to measured to scale by the rule "
                f"the probe found best, or leave {given} out",
                pointer=_LR + "rule",
            )
        return None
    if probe is None:
        if spec.lr_scaling_check is not None:
            raise InvalidValue(
                f"check {spec.lr_scaling_check!r} is looked up by a batchplan server (POST /v1/plans, "
                f"or --url): here, give the probe's result itself as learning_rate.lr_scaling (its "
                f"GET /v1/checks/{{id}} answer's result.lr_scaling)",
                pointer=_LR + "lr_scaling_check",
            )
        raise InvalidValue(
            f'rule "measured" takes an lr-scaling probe\'s result: to measure one, {HOW_TO_MEASURE}. Or '
            f"name a rule (linear, sqrt, none, auto)",
            pointer=_LR + "rule",
        )
    best = probe.best_rule
    rule = PLAN_RULES.get(best) if best is not None else None
    if rule is None:
        why = "named no best rule" if best is None else f"named {best!r}, not a rule the plan scales by"
        raise InvalidValue(
            f"the probe {why}: the plan scales by linear, sqrt or none; probe again with those rules, "
            f"or name a rule by hand",
            pointer=_LR + "lr_scaling/best_rule",
        )
    _same_base(spec)
    run = next((r for r in probe.rules if r.rule == best), None)
    measured = MeasuredRule(
        check=spec.lr_scaling_check,
        best_rule=str(rule),
        holds=run.holds if run else None,
        final_loss_ratio=run.final_loss_ratio if run else None,
        verdict=probe.verdict,
    )
    warnings = []
    if run is not None and run.holds is False:
        ratio = (
            f" (its final loss {run.final_loss_ratio:.4g}x the base run's)" if run.final_loss_ratio else ""
        )
        warnings.append(
            f"the lr-scaling probe's best rule, {best}, did not hold either{ratio}: at this global batch "
            f"no rule it tried trains as well as the base batch; a smaller global batch trains better "
            f"per sample (McCandlish et al. 2018), or probe other rules"
        )
    return rule, measured, warnings


def _same_base(spec: LearningRateSpec) -> None:
    """The probe scaled from its base run; a plan that scales from another base would apply
    the measured rule to numbers it was not measured on."""
    probe = spec.lr_scaling
    assert probe is not None
    if spec.base_batch_tokens is None and probe.base_batch_size not in (None, spec.base_batch_size):
        raise InvalidValue(
            f"the probe's base run had batch {probe.base_batch_size}, this plan's base_batch_size is "
            f"{spec.base_batch_size}: its rule scales from its own base; use base_batch_size "
            f"{probe.base_batch_size}, or probe this base",
            pointer=_LR + "base_batch_size",
            suggestions={"learning_rate.base_batch_size": [probe.base_batch_size]},
        )
    if probe.base_lr is not None and not math.isclose(probe.base_lr, spec.base_lr or 0.0, rel_tol=1e-12):
        raise InvalidValue(
            f"the probe's base run had lr {probe.base_lr!r}, this plan's base_lr is {spec.base_lr!r}: "
            f"its rule scales from its own base; use base_lr {probe.base_lr!r}, or probe this base",
            pointer=_LR + "base_lr",
        )


def _run_of(spec: LearningRateSpec, rule: LRRule) -> ProbeRun | None:
    probe = spec.lr_scaling
    if probe is None:
        return None
    return next((r for r in probe.rules if r.rule == rule.value), None)


def lr_warnings(spec: LearningRateSpec, rule: LRRule, factor: float, lr: float, warmup: int) -> list[str]:
    """A scale-up of 4x or more without warmup; a probe whose run of the rule had another lr
    (it measured another global batch)."""
    out = []
    if factor >= WARMUP_FACTOR and warmup == 0:
        out.append(
            f"the lr is scaled {factor:.4g}x ({spec.base_lr:g} to {lr:g}) with no warmup: Goyal et al. "
            f"2017 held linear scaling to a batch of 8k only with a gradual warmup, from the base lr "
            f"over the first 5 epochs, and without one the first large steps can diverge; set "
            f"learning_rate.warmup_epochs (their 5) or warmup_steps"
        )
    run = _run_of(spec, rule)
    if run is not None and run.lr is not None and not math.isclose(run.lr, lr, rel_tol=1e-9):
        out.append(
            f"the lr-scaling probe ran the {rule.value} rule at lr {run.lr:g}, this plan's batch gives "
            f"{lr:g}: the probe measured another global batch, and a rule that holds at one batch may "
            f"not at another (McCandlish et al. 2018); probe this plan's batch"
        )
    return out


def lr_evidence_sentences(lr: LearningRatePlan, global_batch: int, sequence_length: int | None) -> list[str]:
    """Whether the rule is measured or assumed, in the plan's own numbers."""
    m = lr.measured
    if m is not None:
        probe = f"the lr-scaling probe (check {m.check})" if m.check else "the lr-scaling probe"
        text = (
            f"The {m.best_rule} rule is measured, not assumed: {probe} trained the base run and each "
            f"rule's run from one initialisation on one sample stream, for the same samples, and "
            f"{m.best_rule} came closest to the base run"
        )
        if m.final_loss_ratio is not None:
            text += f", its final loss {m.final_loss_ratio:.4g}x the base run's"
        if m.holds is not None:
            text += " (within the probe's tolerance)" if m.holds else " (outside the probe's tolerance)"
        out = [text + "."]
        if m.verdict:
            out.append(f"The probe's verdict: {m.verdict.rstrip('.')}.")
        return out
    if lr.base_batch_tokens is not None and sequence_length is not None:
        base, batch = f"{lr.base_batch_tokens} tokens", global_batch * sequence_length / lr.base_batch_tokens
    else:
        base, batch = f"{lr.base_batch_size} samples", global_batch / lr.base_batch_size
    if batch == 1:
        return []  # the base batch itself: nothing is scaled
    rule = {"none": "Keeping the lr unscaled (rule none)", "sqrt": "The square-root rule"}.get(
        lr.rule, f"The {lr.rule} rule"
    )
    return [
        f"{rule} is an assumption, not a measurement on this model: whether the scaled lr "
        f"trains as well as the base batch of {base} did depends on the model and its gradient noise "
        f"(McCandlish et al. 2018, Shallue et al. 2019). To measure it, {HOW_TO_MEASURE}."
    ]
