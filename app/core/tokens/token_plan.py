"""Plans in tokens, for language models.

A request may give its batch in tokens, as torchtitan and Megatron users count it:
`global_batch_tokens` (tokens per optimizer step) and `micro_batch_tokens` (tokens per
micro-batch per data-parallel rank, torchtitan's `local_batch_size x seq_len`), with
`sequence_length` tokens per sample. Each must be a whole number of sequences; the planner
then solves in samples, as always, and errors are pointed back at the token fields with their
suggestions in tokens.

`loss_normalization: token` weighs every valid token equally over the whole step. Each rank
sums its per-token losses over valid tokens, divides by the step's global valid-token count
(an all-reduce of the counts over every micro-batch and replica of the step) and multiplies
by data_parallel_size, because DDP averages gradients over replicas. Averaging per
micro-batch or per rank instead weighs tokens unequally wherever lengths vary (the
gradient-accumulation bug of Hugging Face Transformers until `num_items_in_batch`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from app.core.errors.domain import InfeasiblePlan, InvalidValue, PlanError, field_key
from app.core.learning_rate.rules import plan_learning_rate
from app.core.records.integers import nearest
from app.core.records.plan import BatchUnit, LearningRatePlan, Plan, SamplerPlan, TokenPlan
from app.core.records.plan_request import MAX_SAFE_INTEGER, LossNormalization, PlanRequest
from app.core.tokens import packing_text
from app.core.tokens.packing import bounds, check_packing, loss_scale_formula, varies

# Token field -> the sample field it stands for.
TOKEN_FIELDS = {"global_batch_tokens": "global_batch_size", "micro_batch_tokens": "micro_batch_size"}


def _check_range(name: str, pointer: str, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SAFE_INTEGER:
        nearest_ok = min(max(value, 1), MAX_SAFE_INTEGER) if isinstance(value, int) else 1
        raise InvalidValue(
            f"{name} must be a whole number from 1 to {MAX_SAFE_INTEGER}",
            pointer=pointer,
            suggestions={field_key(pointer): [nearest_ok]},
        )


def _whole_sequences(
    request: PlanRequest, name: str, sequence_length: int, plans: Callable[[PlanRequest], object]
) -> int:
    tokens: int = getattr(request, name)
    sequences, rest = divmod(tokens, sequence_length)
    if rest:
        # The whole sequences either side, or the planner's own suggestions from there: values
        # that plan, not merely multiples of the sequence length.
        found: list[int] = []
        for near in (sequences * sequence_length, (sequences + 1) * sequence_length):
            if not 0 < near <= MAX_SAFE_INTEGER:
                continue
            try:
                plans(dataclasses.replace(request, **{name: near}))  # type: ignore[arg-type]
                found.append(near)
            except PlanError as err:
                found += [v for v in err.suggestions.get(name, []) if v % sequence_length == 0]
        raise InfeasiblePlan(
            f"{name} {tokens} is not a whole number of sequences of {sequence_length} tokens "
            f"({tokens} / {sequence_length} = {tokens / sequence_length:g})",
            pointer=f"/{name}",
            suggestions={name: nearest(sorted(set(found)), tokens)},
        )
    return sequences


def in_samples(request: PlanRequest, plans: Callable[[PlanRequest], object]) -> PlanRequest:
    """The request with its token counts turned into samples; raises naming the token field.
    `plans`: the planner, to suggest token counts that plan."""
    seq = request.sequence_length
    _check_range("sequence_length", "/sequence_length", seq)
    check_packing(request)
    lr = request.learning_rate
    _check_range(
        "base_batch_tokens", "/learning_rate/base_batch_tokens", lr.base_batch_tokens if lr else None
    )
    changes: dict[str, int] = {}
    for name, samples_name in TOKEN_FIELDS.items():
        tokens = getattr(request, name)
        if tokens is None:
            continue
        _check_range(name, f"/{name}", tokens)
        if getattr(request, samples_name) is not None:
            raise InvalidValue(f"give {name} or {samples_name}, not both", pointer=f"/{name}", suggestions={})
        if seq is None:
            raise InvalidValue(
                f"{name} needs sequence_length (tokens per sample) to count sequences",
                pointer="/sequence_length",
            )
        changes[samples_name] = _whole_sequences(request, name, seq, plans)
    if lr is not None and lr.base_batch_tokens is not None and seq is None:
        raise InvalidValue(
            "base_batch_tokens scales against tokens per step: give sequence_length too",
            pointer="/sequence_length",
        )
    if not changes:
        return request  # a batch in samples: the hot path, no copy
    return dataclasses.replace(
        request,
        global_batch_size=changes.get("global_batch_size", request.global_batch_size),
        micro_batch_size=changes.get("micro_batch_size", request.micro_batch_size),
    )


def token_pointed(request: PlanRequest, err: PlanError) -> PlanError | None:
    """A planner error about a batch the request gave in tokens, re-pointed at the token field,
    with its suggestions (whole sequences) in tokens; None when it is not about one (raise it
    as it is). A function the planner calls from its `except`, not a context manager: a
    plan that succeeds, nearly all of them, pays nothing for it."""
    seq = request.sequence_length
    renamed = {s: t for t, s in TOKEN_FIELDS.items() if getattr(request, t) is not None}
    if seq is None or not renamed:
        return None

    def in_tokens(values: dict[str, list[int]] | dict[str, int]) -> dict[str, object]:
        return {
            renamed.get(k, k): (
                (
                    [v * seq for v in value if v * seq <= MAX_SAFE_INTEGER]
                    if isinstance(value, list)
                    else value * seq
                )
                if k in renamed
                else value
            )
            for k, value in values.items()
        }

    field = err.pointer.lstrip("/")
    if field not in renamed and not set(err.suggestions) & set(renamed):
        return None
    given = ", ".join(
        f"{t} {getattr(request, t)} is {getattr(request, t) // seq} sequences" for t in renamed.values()
    )
    return dataclasses.replace(
        err,
        detail=f"{given} of {seq} tokens: {err.detail}",
        pointer=f"/{renamed[field]}" if field in renamed else err.pointer,
        suggestions=in_tokens(err.suggestions),  # type: ignore[arg-type]
        combined_suggestions=[in_tokens(c) for c in err.combined_suggestions],  # type: ignore[misc]
    )


def plan_learning_rate_for(
    request: PlanRequest, global_batch: int, optimizer_steps_per_epoch: int | None
) -> tuple[LearningRatePlan, list[str]]:
    """app.core.learning_rate.rules's plan, against tokens per step when the request gives
    base_batch_tokens (kappa = tokens per step / base_batch_tokens), else against samples."""
    spec = request.learning_rate
    assert spec is not None
    seq = request.sequence_length
    epochs = request.dataset.epochs if request.dataset else None
    if spec.base_batch_tokens is None or seq is None:
        return plan_learning_rate(spec, global_batch, optimizer_steps_per_epoch, epochs)
    in_tokens = dataclasses.replace(spec, base_batch_size=spec.base_batch_tokens)
    lr, warnings = plan_learning_rate(
        in_tokens, global_batch * seq, optimizer_steps_per_epoch, epochs, samples_per_step=global_batch
    )
    return dataclasses.replace(
        lr, base_batch_size=spec.base_batch_size, base_batch_tokens=spec.base_batch_tokens
    ), warnings


def _epoch_tokens(sampler: SamplerPlan | None, seq: int) -> int | None:
    if sampler is None:
        return None
    return sampler.micro_steps_per_epoch * sampler.samples_per_micro_step * seq


def token_plan(request: PlanRequest, plan: Plan) -> tuple[TokenPlan | None, list[str], list[str]]:
    """The plan's `tokens`, with its warnings and explanation sentences."""
    seq, norm = request.sequence_length, request.loss_normalization
    if seq is None and norm is LossNormalization.SAMPLE:
        return None, [], []
    unit: BatchUnit = "tokens" if any(getattr(request, t) is not None for t in TOKEN_FIELDS) else "samples"
    dp, G, g = plan.data_parallel_size, plan.global_batch_size, plan.gradient_accumulation_steps
    micro = plan.micro_batch_size
    formula = None
    warnings: list[str] = []
    lines: list[str] = []
    if norm is LossNormalization.TOKEN:
        formula = (
            f"sum of per-token losses over valid tokens x {dp} (data_parallel_size) / the step's "
            f"global valid-token count (all-reduced over all {g} micro-batches x {dp} replicas)"
        )
        lines.append(_token_sentence(dp, G, g, seq))
    elif seq is not None:
        warnings.append(
            "loss_normalization is sample: if sequences hold different numbers of valid tokens "
            "(padding, packing, ignore_index), averaging each micro-batch's loss over its own "
            "tokens weighs a token in a short micro-batch more than one in a long one, so the "
            "gradient is not that of the mean loss over the step's tokens; use "
            "loss_normalization token"
        )
    if seq is not None:
        if plan.sampler is not None and plan.sampler.num_samples_per_replica is not None and micro:
            last = plan.sampler.num_samples_per_replica % micro
            if last:
                warnings.append(
                    f"the last micro-batch of each epoch holds {last * seq} of {micro * seq} tokens "
                    f"per replica ({last} of {micro} sequences of {seq})"
                )
        # Under a token budget a micro-batch holds whatever fits the budget, not micro x seq.
        budgeted = request.packing is not None and request.packing.max_tokens_per_micro_batch is not None
        lines.append(
            f"In tokens: {G} sequences of {seq} = {G * seq} tokens per optimizer step"
            + (
                f", {micro * seq} per micro-batch per replica ({micro} x {seq})."
                if micro and not budgeted
                else "."
            )
        )
    token = TokenPlan(
        unit=unit,
        sequence_length=seq,
        loss_normalization=norm.value,
        tokens_per_micro_batch=micro * seq if micro is not None and seq is not None else None,
        tokens_per_step=G * seq if seq is not None else None,
        tokens_per_epoch=_epoch_tokens(plan.sampler, seq) if seq is not None else None,
        loss_scale_formula=formula,
    )
    if request.packing is None or seq is None:
        return token, warnings, lines
    return _packed(request, plan, token, seq, warnings, lines)


def _packed(
    request: PlanRequest, plan: Plan, token: TokenPlan, seq: int, warnings: list[str], lines: list[str]
) -> tuple[TokenPlan, list[str], list[str]]:
    """`tokens` under packing (app.core.tokens.packing): what varies, its bounds, the exact scale
    with them, and the tools' defaults that are not exact."""
    packing = request.packing
    assert packing is not None
    most_targets, most_micro = bounds(packing, seq, plan)
    budget = packing.max_tokens_per_micro_batch
    packed = dataclasses.replace(
        token,
        # Under a budget a micro-batch holds up to the budget, however many samples that is.
        tokens_per_micro_batch=budget if budget is not None else token.tokens_per_micro_batch,
        packing=packing.mode.value,
        varies=varies(packing),
        max_valid_targets_per_step=most_targets,
        max_micro_batches_per_step=most_micro,
        loss_scale_formula=loss_scale_formula(packing, plan.data_parallel_size, most_targets, most_micro),
    )
    lines = [*lines, packing_text.sentence(packing, seq, plan.global_batch_size, most_targets, most_micro)]
    return packed, warnings + packing_text.warnings(request, plan), lines


def _token_sentence(dp: int, G: int, g: int, seq: int | None) -> str:
    at_most = f" (at most {G * seq} here)" if seq is not None else ""
    return (
        f"Token-normalised loss: each rank sums its per-token losses over valid tokens (padding "
        f"and ignore_index excluded), divides by the step's global valid-token count N, the "
        f"all-reduced sum of the counts over all {g} micro-batch{'es' if g > 1 else ''} of all "
        f"{dp} replicas{at_most}, and multiplies by {dp}, as DDP averages over {dp} replicas: "
        f"then every token weighs 1/N. A loss averaged per micro-batch or per rank weighs tokens "
        f"unequally whenever lengths differ."
    )
