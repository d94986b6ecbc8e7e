"""A check's charts, one table: `GET /v1/checks/{id}/<name>.png|svg` for each `Chart` in
`CHARTS`, all answered alike: 404 for no such check or one whose result has no `<name>`, 409
while it has not finished, the chart drawn off the event loop (chart_response.py) by the
function of app.charts the row names (imported only when a chart is asked for). A kind with a
chart joins with one row."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Response
from fastapi import Path as PathParam

from app.api.chart_response import chart_response
from app.api.checks import EXAMPLE_ID, PROBLEMS, Service
from app.api.deps import require_api_key
from app.api.problems import problem_response
from app.contract.jobs import Job, JobStatus
from app.core.errors.domain import Conflict, NotFound
from app.core.errors.problems import domain_problem
from app.worker.service.service import no_such_check

_IMAGE = {
    "image/png": {"schema": {"type": "string", "format": "binary"}},
    "image/svg+xml": {"schema": {"type": "string"}},
}
_CREATED = "2026-01-01T00:00:00Z"


@dataclass(frozen=True)
class Chart:
    """One chart of a finished check's result: its `name` is the result's key it draws and the
    path's last segment. The sentences are the route's documentation and its problems'."""

    name: str
    draw: str  # the function of app.charts: (data, format, title) -> bytes
    title: Callable[[Mapping[str, Any]], str]  # of the data drawn, after "check {id}: "
    summary: str
    description: str  # its line breaks are the document's
    image: str  # what the 200 answer shows
    missing: str  # the 404's description
    missing_example: str  # the 404 example's name
    not_asked: str  # why a check that succeeded has no `name`
    unfinished: str  # the 409's detail after "is {status}: ", {id} the check's
    whole_result: bool = False  # draws the whole result (its controls beside), not result[name]

    def no_result(self, job: Job) -> NotFound:
        why = (
            self.not_asked if job.status is JobStatus.SUCCEEDED else f"it {job.status.value} without a result"
        )
        return NotFound(f"check {job.id!r} has no {self.name}: {why}")

    def not_finished(self, job: Job) -> Conflict:
        return Conflict(f"check {job.id!r} is {job.status.value}: {self.unfinished.format(id=job.id)}")

    def drawn(self, job: Job) -> Mapping[str, Any]:
        """What the chart draws of the finished job's result; else the problem that says why not."""
        if not job.status.finished:
            raise self.not_finished(job)
        if job.result is None or job.result.get(self.name) is None:
            raise self.no_result(job)
        data: Mapping[str, Any] = job.result if self.whole_result else job.result[self.name]
        return data


CHARTS: tuple[Chart, ...] = (
    Chart(
        "trajectory",
        draw="trajectory_chart",
        title=lambda result: (
            f"{result['steps']} optimizer steps, {result['data_parallel_size']} replicas, "
            f"{'passed' if result['passed'] else 'FAILED'}"
        ),
        summary="A check's run as a chart: loss and lr per step, beside the reference and the controls",
        description=(
            "The run of a finished check of several steps (`steps` above 1): the loss of every\n"
            "optimizer step of the plan's run against the single-process reference run's and each\n"
            "run-level control's (the mistakes it must tell apart), and the lr each stepped with."
        ),
        image="The chart: the loss at every optimizer step of the plan's run, the reference "
        "run's and each run-level control's, and the lr of each.",
        missing="No such check, or it has no trajectory (one step, or no result).",
        missing_example="one_step",
        not_asked="it trained one optimizer step (steps 1): send steps above 1 for a run",
        unfinished="its trajectory is drawn once it has finished (GET /v1/checks/{id} says when)",
        whole_result=True,
    ),
    Chart(
        "throughput",
        draw="throughput_chart",
        title=lambda throughput: f"one replica's micro-step on {throughput['device']}",
        summary="A check's measured throughput as a chart: samples/s against the micro-batch",
        description=(
            "The throughput curve a finished check measured (`throughput`): one replica's samples/s at\n"
            "each micro-batch, with the fastest micro-batch and the knee (the smallest within the margin\n"
            "of the fastest) marked."
        ),
        image="The chart: samples/s against the micro-batch, the fastest and the knee marked.",
        missing="No such check, or it measured no throughput (not asked, or no result).",
        missing_example="not_measured",
        not_asked='it was not asked to measure one: send "throughput": {} with the check',
        unfinished="its throughput is drawn once it has finished (GET /v1/checks/{id} says when)",
    ),
    Chart(
        "lr_scaling",
        draw="lr_scaling_chart",
        title=lambda probe: f"lr scaling to a global batch of {probe['global_batch_size']:,}",
        summary="An lr-scaling probe as a chart: held-out loss against samples, one line a run",
        description=(
            "The runs of a finished lr-scaling probe (`lr_scaling` in the check request): the base\n"
            "run's held-out loss and each rule's at the plan's global batch, against the samples each\n"
            "had trained, with the verdict."
        ),
        image="The chart: each run's held-out loss against the samples it trained.",
        missing="No such check, or it was not an lr-scaling probe (or has no result).",
        missing_example="not_a_probe",
        not_asked="it was not an lr-scaling probe: send lr_scaling (samples, rules) with the check",
        unfinished="its lr-scaling runs are drawn once it has finished "
        "(GET /v1/checks/{id}?wait=30 waits for it)",
    ),
)


def _responses(chart: Chart) -> dict[int | str, dict[str, Any]]:
    succeeded = Job(EXAMPLE_ID, JobStatus.SUCCEEDED, _CREATED, {})
    running = Job(EXAMPLE_ID, JobStatus.RUNNING, _CREATED, {})
    return {
        200: {"description": chart.image, "content": _IMAGE},
        **PROBLEMS,
        404: problem_response(
            chart.missing,
            {
                "unknown_id": domain_problem(no_such_check(EXAMPLE_ID)),
                chart.missing_example: domain_problem(chart.no_result(succeeded)),
            },
        ),
        409: problem_response(
            "The check has not finished.", {"running": domain_problem(chart.not_finished(running))}
        ),
    }


def _route(chart: Chart) -> Callable[..., Awaitable[Response]]:
    async def get_chart(
        check_id: str,
        format: Annotated[Literal["png", "svg"], PathParam(description="The image format.")],
        service: Service,
    ) -> Response:
        data = chart.drawn(await service.get(check_id))
        from app import charts  # matplotlib loads only when a chart is asked for

        draw = getattr(charts, chart.draw)
        return await chart_response(draw, data, format, f"check {check_id}: {chart.title(data)}")

    return get_chart


router = APIRouter(prefix="/v1", tags=["checks"], dependencies=[Depends(require_api_key)])
for _chart in CHARTS:
    router.add_api_route(
        f"/checks/{{check_id}}/{_chart.name}.{{format}}",
        _route(_chart),
        methods=["GET"],
        name=f"get_check_{_chart.name}",  # the operation's id (app.main.operation_id)
        summary=_chart.summary,
        description=_chart.description,
        response_class=Response,
        responses=_responses(_chart),
    )
