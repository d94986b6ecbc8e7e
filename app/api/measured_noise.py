"""`recommend.noise_scale_check`: a finished check that measured the gradient noise scale, looked
up in this server's check store, its B_noise given to the planner as
`recommend.measured_noise_scale` (the id kept, so that the answer cites it). A gradient check's
`noise_scale` gives its critical batch (withheld when the estimate is unreliable, and then
refused here); an lr-scaling probe's gives B_simple at the end of its base run, else at its start.

Each refusal points at the field: no such check, one that measured no noise scale, or failed
without a result, is a 422; a check that has not finished is a 409 (ask again once it has)."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.requests import Request

from app.api.finished_check import finished_result
from app.core.errors.domain import InvalidValue

M = TypeVar("M", bound=BaseModel)
FIELD = "/recommend/noise_scale_check"


def needs_noise_lookup(model: Any) -> bool:
    """Whether a plan request names a noise-scale check by its id."""
    recommend = getattr(model, "recommend", None)
    return recommend is not None and recommend.noise_scale_check is not None


def _noise_of(result: dict[str, Any], check_id: str, pointer: str) -> float:
    """B_noise in samples from a finished check's result."""
    noise = result.get("noise_scale")
    if isinstance(noise, dict):
        critical = noise.get("critical_batch_size")
        if isinstance(critical, (int, float)) and critical > 0:
            return float(critical)
        why = "; ".join(noise.get("unreliable_because") or []) or "it has no critical batch"
        raise InvalidValue(
            f"check {check_id!r} measured a noise scale that is not reliable ({why}): measure again "
            f"over more steps, or give recommend.measured_noise_scale yourself",
            pointer=pointer,
        )
    probe = result.get("lr_scaling")
    measured = probe.get("noise_scale") if isinstance(probe, dict) else None
    if isinstance(measured, dict):
        for when in ("end", "start"):
            value = measured.get(when)
            if isinstance(value, (int, float)) and value > 0:
                return float(value)
    raise InvalidValue(
        f"check {check_id!r} measured no gradient noise scale (its result has neither noise_scale nor "
        f"lr_scaling.noise_scale): name a gradient check of a registered model or an lr-scaling probe",
        pointer=pointer,
    )


async def with_measured_noise(body: M, request: Request, prefix: str = "") -> M:
    """`body` (a plan request) with the named check's B_noise in recommend.measured_noise_scale."""
    recommend = getattr(body, "recommend", None)
    if recommend is None or recommend.noise_scale_check is None:
        return body
    pointer = prefix + FIELD
    check_id = recommend.noise_scale_check
    if recommend.measured_noise_scale is not None:
        raise InvalidValue(
            "give the check's id (noise_scale_check) or its noise scale (measured_noise_scale), not both",
            pointer=pointer,
        )
    result = await finished_result(
        request,
        check_id,
        pointer,
        reads="noise scale",
        instead="recommend.measured_noise_scale",
        wanted="check that measured the noise scale",
        again="run it again",
    )
    noise = _noise_of(dict(result), check_id, pointer)
    changed = recommend.model_copy(update={"measured_noise_scale": noise})
    return body.model_copy(update={"recommend": changed})
