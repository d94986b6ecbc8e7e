"""What a plan says about the scaling law it took its batch or lr from (the plan's
`recommendation`, its warnings and its sentence): the law's numbers beside the plan's, how far
the model lies from what the law was fitted on, the plan's schedule and optimizer against the
law's, and a measured critical batch beside the law's batch."""

from __future__ import annotations

import dataclasses
import math

from app.core.learning_rate.noise_scale import readable
from app.core.learning_rate.recommend import Advice
from app.core.records.plan import LearningRatePlan, Plan
from app.core.records.plan_request import PlanRequest
from app.core.records.recommendation import Law, MeasuredCritical, Recommendation

FAR = 2.0  # a batch or lr further than this factor from the law's is warned about

NOTES = (
    "Power Lines (Bergsma et al. 2025, arXiv:2505.13738) gives the weight decay through AdamW's "
    "timescale B / (lr x weight_decay x D), whose optimum is a power law in tokens per parameter; its "
    "constants could not be read from the paper's text, so batchplan applies no weight-decay law",
    "Zhang et al. 2025 (ICLR, arXiv:2410.21676) measure the critical batch, beyond which more "
    "data-parallel GPUs stop saving steps: a ceiling above the loss-optimal batch, not a recommendation",
)
STEP_LAW_WARMUP = (
    "Step Law's papers do not state the warmup in the text batchplan read: the plan warms up as "
    "learning_rate.warmup_steps says (none unless given)"
)


def with_recommendation(plan: Plan, advice: Advice, request: PlanRequest) -> Plan:
    """`plan` (of advice.request) with its `recommendation`, the law's warnings and sentence."""
    seq = request.sequence_length
    assert seq is not None
    tokens_per_step = plan.global_batch_size * seq
    lr_plan = plan.learning_rate
    measured = _measured(advice, request, seq)
    snap = advice.snap
    planned_tokens = snap.global_batch_size * seq if snap is not None else None
    within = all(f.factor_outside == 1.0 for f in advice.fitted)
    recommendation = Recommendation(
        law=advice.law.law.value,
        batch_tokens=advice.batch_tokens,
        lr=advice.lr,
        planned_batch_tokens=planned_tokens,
        planned_batch_size=snap.global_batch_size if snap is not None else None,
        planned_vs_law_percent=None
        if planned_tokens is None
        else 100 * (planned_tokens / advice.batch_tokens - 1),
        batch_from="law" if advice.batch_from_law else "request",
        lr_from="law" if advice.lr_from_law else "request",
        plan_batch_to_law=tokens_per_step / advice.batch_tokens,
        plan_lr_to_law=None if lr_plan is None else lr_plan.lr / advice.lr,
        train_tokens=advice.spec.train_tokens,
        sequence_length=seq,
        non_embedding_params=advice.counts.non_embedding_params,
        flops_per_token=advice.counts.flops_per_token,
        compute=None
        if advice.counts.flops_per_token is None
        else advice.counts.flops_per_token * advice.spec.train_tokens,
        model=advice.counts,
        within_fit=within,
        fitted_ranges=advice.fitted,
        alternatives=advice.alternatives,
        measured=measured,
        schedule=advice.law.schedule,
        sources=advice.law.sources,
        notes=NOTES + ((STEP_LAW_WARMUP,) if advice.law.law is Law.STEP_LAW else ()),
        explanation=_sentence(advice, planned_tokens, seq, tokens_per_step, lr_plan),
    )
    warnings = _fit_warnings(advice) + _recipe_warnings(advice, lr_plan)
    warnings += _distance_warnings(recommendation, tokens_per_step, lr_plan) + _measured_warnings(
        measured, recommendation.batch_tokens
    )
    return dataclasses.replace(
        plan,
        # The request asked for no batch where the law gave it (CONTRACT: this echoes the request).
        requested_global_batch_size=None if advice.batch_from_law else plan.requested_global_batch_size,
        recommendation=recommendation,
        warnings=plan.warnings + tuple(warnings),
        explanation=(*plan.explanation, recommendation.explanation),
    )


def _sentence(
    advice: Advice,
    planned_tokens: int | None,
    seq: int,
    tokens_per_step: int,
    lr_plan: LearningRatePlan | None,
) -> str:
    law, counts = advice.law, advice.counts
    if law.law is Law.STEP_LAW:
        of = (
            f"N = {counts.non_embedding_params:.4g} non-embedding parameters and "
            f"D = {advice.spec.train_tokens:.4g} tokens"
        )
    else:
        assert counts.flops_per_token is not None
        compute = counts.flops_per_token * advice.spec.train_tokens
        of = (
            f"C = M x D = {counts.flops_per_token:.4g} FLOPs per token x "
            f"{advice.spec.train_tokens:.4g} tokens = {compute:.4g} FLOPs"
        )
    text = (
        f"{law.title} for {of}: peak lr {law.lr_formula} = {advice.lr:.4g} and global batch "
        f"{law.batch_formula} = {advice.batch_tokens:.0f} tokens "
        f"({advice.batch_tokens / seq:.1f} sequences of {seq})"
    )
    if planned_tokens is not None:
        assert advice.snap is not None
        text += (
            f"; the nearest global batch this cluster splits exactly is {advice.snap.global_batch_size} "
            f"sequences = {planned_tokens} tokens ({100 * (planned_tokens / advice.batch_tokens - 1):+.2f}%)"
        )
    batch = (
        "the plan runs it"
        if advice.batch_from_law
        else f"the plan runs the request's {tokens_per_step} tokens"
    )
    if lr_plan is None:
        return f"{text}; {batch}."
    lr = (
        f"the law's lr (rule {lr_plan.rule}: {lr_plan.lr:.4g})"
        if advice.lr_from_law
        else f"the request's lr {lr_plan.lr:.4g} ({lr_plan.lr / advice.lr:.3g}x the law's)"
    )
    return f"{text}; {batch} with {lr}."


def _fit_warnings(advice: Advice) -> list[str]:
    out = []
    for fit in advice.fitted:
        if fit.factor_outside == 1.0:
            continue
        where = "above" if fit.value > fit.high else "below"
        span = f"{fit.low:.4g}" if fit.low == fit.high else f"{fit.low:.4g} to {fit.high:.4g}"
        out.append(
            f"{fit.quantity} {fit.value:.4g} is {readable(fit.factor_outside)}x {where} what "
            f"{advice.law.title} was fitted on ({span}): its batch and lr are an extrapolation there"
        )
    return out


def _recipe_warnings(advice: Advice, lr: LearningRatePlan | None) -> list[str]:
    """The plan's schedule and optimizer against the law's."""
    if lr is None:
        return []
    law, out = advice.law, []
    if lr.optimizer != "adamw":
        out.append(f"optimizer {lr.optimizer}: {law.title} was fitted with AdamW; its lr is AdamW's")
    if law.law is Law.STEP_LAW:
        floor_ok = abs(lr.min_lr - 1e-5) <= 1e-7 or (lr.min_lr == lr.lr < 1e-5)
        if lr.decay != "cosine" or not floor_ok:
            out.append(
                f"the plan's decay is {lr.decay} with min lr {lr.min_lr:g}; {law.title} was fitted with "
                f"cosine decay to a fixed min lr of 1e-5 (its optimum moves when min lr is max lr / 10): "
                f"set learning_rate.decay cosine and min_lr 1e-5"
            )
    elif lr.decay != "step":
        out.append(
            f"the plan's decay is {lr.decay}; {law.title} was fitted with a multi-step schedule (the lr "
            f"stepped down after 80% and 90% of the tokens): set learning_rate.decay step with those "
            f"milestones and gamma 0.316"
        )
    return out


def _distance_warnings(rec: Recommendation, tokens_per_step: int, lr: LearningRatePlan | None) -> list[str]:
    out = []
    if not 1 / FAR <= rec.plan_batch_to_law <= FAR:
        out.append(
            f"the plan's global batch of {tokens_per_step} tokens is {readable(rec.plan_batch_to_law)}x "
            f"the law's {rec.batch_tokens:.0f}"
            + (
                f"; the nearest batch this cluster splits is {rec.planned_batch_tokens} tokens"
                if rec.planned_batch_tokens is not None
                else ""
            )
        )
    if lr is not None and rec.plan_lr_to_law is not None and not 1 / FAR <= rec.plan_lr_to_law <= FAR:
        out.append(
            f"the plan's peak lr {lr.lr:.4g} is {readable(rec.plan_lr_to_law)}x the law's {rec.lr:.4g}"
            + ("" if rec.lr_from == "request" else f" (scaled by rule {lr.rule} from the law's batch)")
        )
    return out


def _measured(advice: Advice, request: PlanRequest, seq: int) -> MeasuredCritical | None:
    """A measured noise scale (recommend's, else the plan's gradient_noise_scale) as a critical
    batch in tokens beside the law's."""
    spec = advice.spec
    if spec.measured_noise_scale is not None:
        noise = spec.measured_noise_scale
        source = (
            f"check {spec.noise_scale_check}" if spec.noise_scale_check else "recommend.measured_noise_scale"
        )
    elif request.gradient_noise_scale is not None:
        noise, source = request.gradient_noise_scale, "gradient_noise_scale"
    else:
        return None
    critical = noise * seq
    return MeasuredCritical(
        noise_scale=noise,
        critical_batch_tokens=critical,
        source=source,
        larger="law" if advice.batch_tokens > critical else "measured",
        measured_to_law=critical / advice.batch_tokens,
    )


def _measured_warnings(measured: MeasuredCritical | None, law_batch_tokens: float) -> list[str]:
    if measured is None or measured.larger == "measured":
        return []
    # From the tokens, not 1 / measured_to_law: a vanishing noise scale's ratio underflows to 0.
    over = law_batch_tokens / measured.critical_batch_tokens
    times = readable(over) if math.isfinite(over) else "more than 1e308"
    return [
        f"the law's batch is {times}x the measured critical batch "
        f"({measured.critical_batch_tokens:.0f} tokens: B_noise {readable(measured.noise_scale)} "
        f"sequences, {measured.source}): past the critical batch more tokens per step stop saving steps "
        f"(McCandlish et al. 2018); the noise scale grows as the loss falls, so one measured early in "
        f"training reads low"
    ]
