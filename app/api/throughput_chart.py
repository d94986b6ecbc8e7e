"""GET /v1/checks/{id}/throughput.png|svg: the curve a check measured (`throughput`) as a
chart. Problems as the trajectory chart's: 404 for no such check or one that measured none,
409 while it runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Response
from fastapi import Path as PathParam

from app.api.chart_response import chart_response
from app.api.checks import _EXAMPLE_ID, _EXAMPLE_JOB, _PROBLEMS, _TRAJECTORY_PROBLEMS, Service, not_finished
from app.api.deps import require_api_key
from app.api.problems import problem_response
from app.contract.jobs import Job, JobStatus
from app.core.errors.domain import NotFound
from app.core.errors.problems import domain_problem
from app.worker.service.service import no_such_check

router = APIRouter(prefix="/v1", tags=["checks"], dependencies=[Depends(require_api_key)])


def no_throughput(job: Job) -> NotFound:
    why = (
        'it was not asked to measure one: send "throughput": {} with the check'
        if job.status is JobStatus.SUCCEEDED
        else f"it {job.status.value} without a result"
    )
    return NotFound(f"check {job.id!r} has no throughput: {why}")


def _throughput_of(job: Job) -> Mapping[str, Any]:
    """The finished job's result, when it measured a throughput curve; else why not."""
    if not job.status.finished:
        raise not_finished(job, "throughput")
    if job.result is None or job.result.get("throughput") is None:
        raise no_throughput(job)
    return job.result


_RUNNING = Job(_EXAMPLE_ID, JobStatus.RUNNING, "2026-01-01T00:00:00Z", {})
_THROUGHPUT_PROBLEMS: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The chart: samples/s against the micro-batch, the fastest and the knee marked.",
        "content": _TRAJECTORY_PROBLEMS[200]["content"],
    },
    **_PROBLEMS,
    404: problem_response(
        "No such check, or it measured no throughput (not asked, or no result).",
        {
            "unknown_id": domain_problem(no_such_check(_EXAMPLE_ID)),
            "not_measured": domain_problem(no_throughput(_EXAMPLE_JOB)),
        },
    ),
    409: problem_response(
        "The check has not finished.", {"running": domain_problem(not_finished(_RUNNING, "throughput"))}
    ),
}


@router.get(
    "/checks/{check_id}/throughput.{format}",
    summary="A check's measured throughput as a chart: samples/s against the micro-batch",
    response_class=Response,
    responses=_THROUGHPUT_PROBLEMS,
)
async def get_check_throughput(
    check_id: str,
    format: Annotated[Literal["png", "svg"], PathParam(description="The image format.")],
    service: Service,
) -> Response:
    """The throughput curve a finished check measured (`throughput`): one replica's samples/s at
    each micro-batch, with the fastest micro-batch and the knee (the smallest within the margin
    of the fastest) marked."""
    result = _throughput_of(await service.get(check_id))
    from app.charts import throughput_chart  # matplotlib loads only when a chart is asked for

    title = f"check {check_id}: one replica's micro-step on {result['throughput']['device']}"
    return await chart_response(throughput_chart, result["throughput"], format, title)
