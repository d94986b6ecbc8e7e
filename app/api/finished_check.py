"""A finished check's result looked up by the id a plan request names (a probe for
`learning_rate.lr_scaling_check`, a noise-scale check for `recommend.noise_scale_check`).

The refusals are the same whichever field names the check, so they live here once, each pointing
at that field: no worker, or no such check, or one that failed without a result, is a 422; a check
that has not finished is a 409 (ask again once it has)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request

from app.contract.jobs import JobStatus
from app.core.errors.domain import Conflict, InvalidValue, NotFound
from app.worker.service.service import CheckService


async def finished_result(
    request: Request, check_id: str, pointer: str, *, reads: str, instead: str, wanted: str, again: str
) -> Mapping[str, Any]:
    """The result of the finished check `check_id`. `reads` is what the plan takes from it (for
    the 409), `instead` the field that can carry the numbers themselves, `wanted` the kind of check
    to name, `again` how to run it again."""
    service: CheckService | None = request.app.state.checks
    if service is None:
        raise InvalidValue(
            f"this server runs no checks ({request.app.state.worker_error or 'its worker is disabled'}), "
            f"so it holds no check {check_id!r}: give {instead}",
            pointer=pointer,
        )
    try:
        job = await service.get(check_id)
    except NotFound:
        raise InvalidValue(
            f"no check {check_id!r} on this server (GET /v1/checks lists them): give the id of a "
            f"finished {wanted}, or {instead}",
            pointer=pointer,
        ) from None
    if not job.status.finished:
        raise Conflict(
            f"check {check_id!r} is {job.status.value}: the plan reads its {reads} once it has "
            f"finished; wait for it (GET /v1/checks/{check_id}?wait=30) and plan again",
            pointer=pointer,
        )
    result = job.result if job.status is JobStatus.SUCCEEDED else None
    if result is None:
        raise InvalidValue(
            f"check {check_id!r} {job.status.value} without a result"
            + (f" ({job.error})" if job.error else "")
            + f": {again}",
            pointer=pointer,
        )
    return result
