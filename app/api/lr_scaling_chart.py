"""GET /v1/checks/{id}/lr_scaling.png|svg: an lr-scaling probe's runs as a chart, the held-out
loss against the samples trained, one line a run (the base run and each rule's). Problems as
the trajectory chart's: 404 for no such check or one that is not a probe, 409 while it runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Response
from fastapi import Path as PathParam

from app.api.chart_response import chart_response
from app.api.checks import _EXAMPLE_ID, _PROBLEMS, Service
from app.api.deps import require_api_key
from app.api.problems import problem_response
from app.contract.jobs import Job, JobStatus
from app.core.errors.domain import Conflict, NotFound
from app.core.errors.problems import domain_problem
from app.worker.service.service import no_such_check

router = APIRouter(prefix="/v1", tags=["checks"], dependencies=[Depends(require_api_key)])


def no_probe(job: Job) -> NotFound:
    why = (
        "it was not an lr-scaling probe: send lr_scaling (samples, rules) with the check"
        if job.status is JobStatus.SUCCEEDED
        else f"it {job.status.value} without a result"
    )
    return NotFound(f"check {job.id!r} has no lr_scaling: {why}")


def probe_not_finished(job: Job) -> Conflict:
    return Conflict(
        f"check {job.id!r} is {job.status.value}: its lr-scaling runs are drawn once it has finished "
        f"(GET /v1/checks/{job.id}?wait=30 waits for it)"
    )


def _probe_of(job: Job) -> Mapping[str, Any]:
    if not job.status.finished:
        raise probe_not_finished(job)
    if job.result is None or job.result.get("lr_scaling") is None:
        raise no_probe(job)
    probe: Mapping[str, Any] = job.result["lr_scaling"]
    return probe


_CREATED = "2026-01-01T00:00:00Z"
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The chart: each run's held-out loss against the samples it trained.",
        "content": {
            "image/png": {"schema": {"type": "string", "format": "binary"}},
            "image/svg+xml": {"schema": {"type": "string"}},
        },
    },
    **_PROBLEMS,
    404: problem_response(
        "No such check, or it was not an lr-scaling probe (or has no result).",
        {
            "unknown_id": domain_problem(no_such_check(_EXAMPLE_ID)),
            "not_a_probe": domain_problem(no_probe(Job(_EXAMPLE_ID, JobStatus.SUCCEEDED, _CREATED, {}))),
        },
    ),
    409: problem_response(
        "The check has not finished.",
        {"running": domain_problem(probe_not_finished(Job(_EXAMPLE_ID, JobStatus.RUNNING, _CREATED, {})))},
    ),
}


@router.get(
    "/checks/{check_id}/lr_scaling.{format}",
    summary="An lr-scaling probe as a chart: held-out loss against samples, one line a run",
    response_class=Response,
    responses=_RESPONSES,
)
async def get_check_lr_scaling(
    check_id: str,
    format: Annotated[Literal["png", "svg"], PathParam(description="The image format.")],
    service: Service,
) -> Response:
    """The runs of a finished lr-scaling probe (`lr_scaling` in the check request): the base
    run's held-out loss and each rule's at the plan's global batch, against the samples each
    had trained, with the verdict."""
    probe = _probe_of(await service.get(check_id))
    from app.charts import lr_scaling_chart  # matplotlib loads only when a chart is asked for

    title = f"check {check_id}: lr scaling to a global batch of {probe['global_batch_size']:,}"
    return await chart_response(lr_scaling_chart, probe, format, title)
