"""`learning_rate.lr_scaling_check`: an lr-scaling probe named by its check id, looked up in this
server's check store and given to the planner as its numbers (`lr_scaling`), the id kept so that
the plan cites it. Every route that plans a request calls `with_measured_lr` before planning;
the core refuses an id it was not given the numbers of (the CLI without --url, the rank program).

Each refusal points at the field: no such check, or one that is not an lr-scaling probe or failed
without a result, is a 422; a probe that has not finished is a 409 (ask again once it has)."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from app.api.finished_check import finished_result
from app.api.measured_noise import needs_noise_lookup, with_measured_noise
from app.core.errors.domain import InvalidValue
from app.schemas.lr_scaling_in import LrScalingIn
from app.schemas.plan_recipe_in import LearningRateIn

M = TypeVar("M", bound=BaseModel)
FIELD = "/learning_rate/lr_scaling_check"


def needs_lookup(model: Any) -> bool:
    """Whether a plan request (or any body with a learning_rate) names a probe by its id, or a
    noise-scale check for its recommend (app.api.measured_noise)."""
    lr = getattr(model, "learning_rate", None)
    return (lr is not None and lr.lr_scaling_check is not None) or needs_noise_lookup(model)


async def with_measured_lr(body: M, request: Request, prefix: str = "") -> M:
    """`body` (a model with `learning_rate`) with the named probe's `lr_scaling` filled in, and a
    recommend's named noise-scale check (app.api.measured_noise)."""
    return await with_measured_noise(await _with_probe(body, request, prefix), request, prefix)


async def _with_probe(body: M, request: Request, prefix: str) -> M:
    lr: LearningRateIn | None = getattr(body, "learning_rate", None)
    if lr is None or lr.lr_scaling_check is None:
        return body
    pointer = prefix + FIELD
    check_id = lr.lr_scaling_check
    if lr.lr_scaling is not None:
        raise InvalidValue(
            "give the probe's check id (lr_scaling_check) or its result (lr_scaling), not both",
            pointer=pointer,
        )
    result = await finished_result(
        request,
        check_id,
        pointer,
        reads="lr_scaling",
        instead="the probe's result as learning_rate.lr_scaling",
        wanted="lr-scaling probe (POST /v1/checks with lr_scaling)",
        again="run the lr-scaling probe again",
    )
    found = result.get("lr_scaling")
    if found is None:
        raise InvalidValue(
            f"check {check_id!r} is not an lr-scaling probe (its result has no lr_scaling): probe with "
            f"POST /v1/checks and lr_scaling (batchplan check --lr-scaling SAMPLES)",
            pointer=pointer,
        )
    try:
        numbers = LrScalingIn.model_validate(found)
    except ValidationError as err:
        raise InvalidValue(
            f"check {check_id!r}'s lr_scaling cannot be read as a probe's result ({err.error_count()} "
            f"errors, first: {err.errors()[0]['msg']}): give its numbers as learning_rate.lr_scaling",
            pointer=pointer,
        ) from None
    changed = lr.model_copy(update={"lr_scaling": numbers})
    return body.model_copy(update={"learning_rate": changed})
