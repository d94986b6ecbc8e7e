"""A tokens check of a registered model: the model's sequences against the plan's
`sequence_length`.

The check trains the model's own data, whose sequences the plan does not lengthen or cut. A
plan counted in tokens (`global_batch_tokens`, `micro_batch_tokens`) was turned into sequences
of the plan's length: with sequences of another length every step would hold other token
counts than the plan's, so the check would prove a plan nobody asked for, and it is refused.
A plan counted in samples is split the same whatever the length; only its token figures
(tokens per step, per micro-batch) assume the plan's length, which a warning says.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from app.contract.request import CheckRequest, build_spec
from app.contract.spec import CheckSpec
from app.contract.spec_error import SpecError
from app.core.errors.domain import DomainError
from app.core.records.plan_request import PlanRequest

POINTER = "/plan/sequence_length"


def sequence_length_warning(spec: CheckSpec, model_length: int | None) -> str | None:
    """What the result should say when the model's sequences are not the plan's length;
    None when they are, or either is unknown. Raises SpecError when the plan counts tokens."""
    planned = spec.sequence_length
    if spec.workload != "tokens" or model_length is None or planned is None or planned == model_length:
        return None
    if spec.batch_unit == "tokens":
        G = spec.global_batch_size
        raise SpecError(
            f"the model's sequences have {model_length} tokens and the plan's sequence_length is "
            f"{planned}: the plan counts its batch in tokens, and its {G} sequences a step would hold "
            f"{G * model_length} token positions of this model's data, not the plan's {G * planned}; "
            f"plan with sequence_length {model_length}",
            POINTER,
        )
    return (
        f"the model's sequences have {model_length} tokens, the plan's sequence_length is {planned}: "
        f"the check ran the model's sequences (the split in samples is the plan's), but the plan's "
        f"token figures (tokens per step and per micro-batch) assume {planned}; give sequence_length "
        f"{model_length} for figures that count this model's tokens"
    )


def refuse_another_sequence_length(request: CheckRequest, spec: CheckSpec, model_length: int | None) -> None:
    """The refusal of `sequence_length_warning`, with what works: the model's length alone
    when the plan's token counts are whole sequences of it, else with the token counts of the
    same split in sequences. Each is planned and built as a check before it is suggested."""
    try:
        sequence_length_warning(spec, model_length)
    except SpecError as err:
        assert model_length is not None
        raise dataclasses.replace(err, **_what_works(request, spec, model_length)) from None


def _what_works(request: CheckRequest, spec: CheckSpec, length: int) -> dict[str, Any]:
    plan = request.plan
    alone = dataclasses.replace(plan, sequence_length=length)
    if _checks(request, alone):
        return {"suggestions": {"sequence_length": [length]}}
    # The same split in sequences, its token fields counted in the model's sequences.
    scaled: dict[str, int] = {}
    if plan.global_batch_tokens is not None:
        scaled["global_batch_tokens"] = spec.global_batch_size * length
    if plan.micro_batch_tokens is not None:
        if spec.split != "even":
            return {}
        scaled["micro_batch_tokens"] = spec.slices[0].micro_batch_size * length
    together = dataclasses.replace(
        alone,
        global_batch_tokens=scaled.get("global_batch_tokens", plan.global_batch_tokens),
        micro_batch_tokens=scaled.get("micro_batch_tokens", plan.micro_batch_tokens),
    )
    if _checks(request, together):
        return {"combined_suggestions": [{"sequence_length": length, **scaled}]}
    return {}


def _checks(request: CheckRequest, plan: PlanRequest) -> bool:
    try:
        build_spec(dataclasses.replace(request, plan=plan))
    except DomainError:
        return False
    return True
