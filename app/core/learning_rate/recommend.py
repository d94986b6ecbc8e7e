"""A plan request's `recommend`: a published scaling law's global batch and peak lr for the model
(app.core.learning_rate.scaling_laws), the batch snapped to the nearest one this cluster splits
exactly, and the request the planner then plans, with the law's numbers written in where the
request leaves them out.

The snap (app.core.learning_rate.batch_snap) needs the planner, which sits floors above: the
planner hands in `plans` (a request to its plan, raising PlanError where it does not plan) and
its data-parallel size. What the plan then says about the law is
app.core.learning_rate.law_report's.
"""

from __future__ import annotations

import dataclasses
import math

from app.core.errors.domain import InfeasiblePlan, InvalidValue
from app.core.learning_rate import model_counts
from app.core.learning_rate import scaling_laws as laws
from app.core.learning_rate.batch_snap import TRIES_PER_SIDE, Plans, Snap, batch_request, gives_batch
from app.core.learning_rate.batch_snap import snap as snap_batch
from app.core.records.plan import Plan
from app.core.records.plan_request import (
    MAX_SAFE_INTEGER,
    Decay,
    LearningRateSpec,
    LRRule,
    Optimizer,
    PlanRequest,
)
from app.core.records.recommendation import FitRange, Law, LawPoint, ModelCounts, RecommendSpec
from app.core.records.record import record

_REC = "/recommend/"


@record
class Advice:
    """What the planner plans for a request with `recommend`, and what the answer reports."""

    request: PlanRequest  # the law's numbers written in, `recommend` dropped
    spec: RecommendSpec
    law: laws.ScalingLaw
    batch_tokens: float
    lr: float
    counts: ModelCounts
    fitted: tuple[FitRange, ...]
    alternatives: tuple[LawPoint, ...]
    snap: Snap | None
    batch_from_law: bool
    lr_from_law: bool


def advise(request: PlanRequest, data_parallel_size: int, uneven: bool, plans: Plans) -> Advice:
    """The law's numbers for the request's model and the request to plan. `uneven`: replicas
    may take different shares (node groups of other throughputs, or divisibility balance)."""
    spec = request.recommend
    assert spec is not None
    seq = _checked(request, spec)
    counts = counted(spec, seq)
    inputs = laws.Inputs(counts.non_embedding_params, spec.train_tokens, counts.flops_per_token, seq)
    law = laws.LAWS[spec.law]
    found = law.evaluate(inputs)
    assert found is not None  # _checked refused a request without what the law needs
    batch_tokens, lr = found
    snap = snap_batch(request, batch_tokens / seq, data_parallel_size, uneven, plans)
    batch_from_law = not gives_batch(request)
    if batch_from_law and snap is None:
        raise InfeasiblePlan(
            f"no global batch within {TRIES_PER_SIDE} steps of {law.title}'s {batch_tokens:.0f} tokens "
            f"({batch_tokens / seq:.1f} sequences of {seq}) splits exactly on this cluster: give "
            f"global_batch_tokens yourself",
            pointer="/recommend/law",
        )
    lr_spec = request.learning_rate
    lr_from_law = lr_spec is None or lr_spec.base_lr is None
    batch_only = batch_request(request, keep_batch=not batch_from_law)
    if batch_from_law:
        assert snap is not None
        batch_only = dataclasses.replace(batch_only, global_batch_tokens=snap.global_batch_size * seq)
    filled = dataclasses.replace(
        request,
        recommend=None,
        global_batch_size=batch_only.global_batch_size,
        global_batch_tokens=batch_only.global_batch_tokens,
        learning_rate=_learning_rate(request, law, lr, batch_tokens, snap, batch_from_law, plans),
    )
    return Advice(
        request=filled,
        spec=spec,
        law=law,
        batch_tokens=batch_tokens,
        lr=lr,
        counts=counts,
        fitted=fitted_ranges(law, inputs),
        alternatives=alternatives(spec.law, inputs),
        snap=snap,
        batch_from_law=batch_from_law,
        lr_from_law=lr_from_law,
    )


def _checked(request: PlanRequest, spec: RecommendSpec) -> int:
    """The sequence length, once every number of `recommend` is one a law can read; a law
    without what it needs is refused at the field it needs."""
    _whole(spec.train_tokens, "train_tokens")
    if spec.non_embedding_params is not None:
        _whole(spec.non_embedding_params, "non_embedding_params")
    for name in ("flops_per_token", "measured_noise_scale"):
        value = getattr(spec, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise InvalidValue(f"{name} must be finite and > 0", pointer=_REC + name)
    if spec.architecture is not None:
        if spec.non_embedding_params is not None or spec.flops_per_token is not None:
            raise InvalidValue(
                "give the model as non_embedding_params (and flops_per_token) or as an architecture, "
                "not both: batchplan counts both from the architecture",
                pointer=_REC + "architecture",
            )
        model_counts.check_architecture(spec.architecture)
    elif getattr(spec, laws.LAWS[spec.law].needs) is None:
        need = laws.LAWS[spec.law].needs
        what = (
            "N, the non-embedding parameters"
            if need == "non_embedding_params"
            else ("M, the non-embedding FLOPs per token including attention (not 6N)")
        )
        raise InvalidValue(
            f"{laws.LAWS[spec.law].title} needs {what}: give {need}, or the architecture to count it from",
            pointer=_REC + need,
        )
    if spec.noise_scale_check is not None and spec.measured_noise_scale is None:
        raise InvalidValue(
            f"noise_scale_check {spec.noise_scale_check!r} names a check a server holds: plan on that "
            f"server (batchplan --url), or give its B_noise as recommend.measured_noise_scale",
            pointer=_REC + "noise_scale_check",
        )
    if request.sequence_length is None:
        raise InvalidValue(
            "recommend needs sequence_length: the laws' batches are in tokens, the plan's in sequences",
            pointer="/sequence_length",
        )
    lr = request.learning_rate
    if lr is not None and lr.base_lr is None and lr.base_batch_tokens is not None:
        raise InvalidValue(
            "base_batch_tokens is the batch base_lr was tuned at; without base_lr the law gives the lr "
            "and its batch is the base: leave base_batch_tokens out, or give base_lr too",
            pointer="/learning_rate/base_batch_tokens",
        )
    return request.sequence_length


def _whole(value: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SAFE_INTEGER:
        raise InvalidValue(
            f"{name} must be a whole number from 1 to {MAX_SAFE_INTEGER}",
            pointer=_REC + name,
            suggestions={f"recommend.{name}": [1]} if isinstance(value, int) and value < 1 else {},
        )


def counted(spec: RecommendSpec, sequence_length: int) -> ModelCounts:
    """N and M as given, or counted from the architecture (app.core.learning_rate.model_counts)."""
    a = spec.architecture
    if a is None:
        return ModelCounts(spec.non_embedding_params, spec.flops_per_token, "request")
    return ModelCounts(
        non_embedding_params=model_counts.non_embedding_params(a),
        flops_per_token=float(model_counts.flops_per_token(a, sequence_length)),
        counted_from="architecture",
        embedding_params=model_counts.embedding_params(a),
        flops_per_token_convention=model_counts.convention(a, sequence_length),
    )


def fitted_ranges(law: laws.ScalingLaw, inputs: laws.Inputs) -> tuple[FitRange, ...]:
    out = []
    for fit in law.fitted:
        value = fit.value(inputs)
        if value is not None:
            factor = laws.factor_outside(value, fit.low, fit.high)
            out.append(FitRange(fit.quantity, float(value), float(fit.low), float(fit.high), factor))
    return tuple(out)


def alternatives(chosen: object, inputs: laws.Inputs) -> tuple[LawPoint, ...]:
    """Every other law's numbers for the same model, or why it has none."""
    out = []
    for name, law in laws.LAWS.items():
        if name == chosen:
            continue
        found = law.evaluate(inputs)
        if found is None:
            out.append(LawPoint(law.law.value, None, None, None, f"it needs {law.needs}"))
            continue
        within = all(f.factor_outside == 1.0 for f in fitted_ranges(law, inputs))
        out.append(LawPoint(law.law.value, found[0], found[1], within))
    return tuple(out)


def _learning_rate(
    request: PlanRequest,
    law: laws.ScalingLaw,
    lr: float,
    batch_tokens: float,
    snap: Snap | None,
    batch_from_law: bool,
    plans: Plans,
) -> LearningRateSpec | None:
    """The request's recipe with the law's peak lr where it gives none (scaled from the law's
    batch, rule none unless it names another), or, without a recipe, the law's own."""
    spec = request.learning_rate
    if spec is not None and spec.base_lr is not None:
        return spec
    base_batch = max(1, round(batch_tokens))
    if spec is not None:
        rule = LRRule.NONE if spec.rule is LRRule.AUTO else spec.rule
        return dataclasses.replace(spec, base_lr=lr, base_batch_tokens=base_batch, rule=rule)
    batch_plan = (
        snap.plan if batch_from_law and snap is not None else plans(batch_request(request, keep_batch=True))
    )
    return law_recipe(law, lr, base_batch, *_run_length(request, batch_plan))


def _run_length(request: PlanRequest, batch_plan: Plan) -> tuple[int, bool]:
    """The run's optimizer steps: the dataset's epochs where the request gives them (then True),
    else train_tokens over the planned batch's tokens, to the nearest step."""
    sampler = batch_plan.sampler
    if request.dataset is not None and sampler is not None and sampler.total_optimizer_steps is not None:
        return sampler.total_optimizer_steps, True
    assert request.recommend is not None and request.sequence_length is not None
    tokens_per_step = batch_plan.global_batch_size * request.sequence_length
    return max(1, round(request.recommend.train_tokens / tokens_per_step)), False


def law_recipe(
    law: laws.ScalingLaw, lr: float, base_batch_tokens: int, steps: int, from_epochs: bool
) -> LearningRateSpec:
    """The recipe the law was fitted with, as far as its paper states it, over a run of `steps`
    optimizer steps (given as train_steps unless the dataset's epochs set the run's length)."""
    common = LearningRateSpec(
        base_lr=lr,
        base_batch_tokens=base_batch_tokens,
        rule=LRRule.NONE,
        optimizer=Optimizer.ADAMW,
        train_steps=None if from_epochs else steps,
    )
    if law.law is Law.STEP_LAW:
        return dataclasses.replace(common, decay=Decay.COSINE, min_lr=min(laws.STEP_LAW_MIN_LR, lr))
    first, second = (math.ceil(f * steps) for f in laws.DEEPSEEK_MILESTONES)
    deepseek = dataclasses.replace(
        common,
        betas=laws.DEEPSEEK_BETAS,
        weight_decay=laws.DEEPSEEK_WEIGHT_DECAY,
        max_grad_norm=laws.DEEPSEEK_MAX_GRAD_NORM,
        warmup_start_lr=0.0,
    )
    if not 1 < first < second < steps:  # a run too short for the law's two steps
        warmup = min(laws.DEEPSEEK_WARMUP_STEPS, steps - 1)
        return dataclasses.replace(deepseek, warmup_steps=warmup, warmup_start_lr=0.0 if warmup else None)
    return dataclasses.replace(
        deepseek,
        warmup_steps=min(laws.DEEPSEEK_WARMUP_STEPS, first - 1),
        decay=Decay.STEP,
        milestones=(first, second),
        gamma=laws.DEEPSEEK_GAMMA,
    )
