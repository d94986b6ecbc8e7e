"""The worker's routes: gradient checks of a plan with real torch.distributed, and the host.
A check's charts are check_charts.py's."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request, Response

from app.api.deps import API_KEY_HELP, require_api_key
from app.api.exposure import exposure
from app.api.json_body import JsonBodyRoute
from app.api.measured_lr import with_measured_lr
from app.api.plans import refused_plans
from app.api.problems import PROBLEM_RESPONSES, problem_response, refusal
from app.contract.codec import encode, json_text
from app.contract.jobs import Job, JobStatus
from app.core.errors.domain import Unavailable
from app.core.errors.problems import domain_problem, problem_body
from app.schemas.check_examples import CHECK_EXAMPLES
from app.schemas.checks import (
    CheckJobOut,
    CheckListOut,
    CheckRequestIn,
    StatusQuery,
    job_json,
)
from app.schemas.finished_checks import FINISHED_CHECKS
from app.schemas.host import CheckModelsOut, HostOut
from app.worker.service.service import CheckService, no_such_check, queue_full, shutting_down

# The longest a GET of a check waits for it to finish: below the idle timeouts of common proxies.
MAX_WAIT_S = 60.0
# How long a GET without ?wait holds the answer about a check that has not finished: a client
# that asks in a tight loop then asks a few dozen times a second, not hundreds, and takes that
# much less CPU from the ranks of the check it waits for, and it still hears of the finish at
# once (bench/bench_polling.py on 2 cores: mesh checks 1.10-1.17x slower under a 2 ms poll
# answered at once, 1.00-1.03x under one held).
HOLD_S = 0.025

router = APIRouter(
    prefix="/v1", tags=["checks"], dependencies=[Depends(require_api_key)], route_class=JsonBodyRoute
)


def _worker_disabled(reason: str | None) -> Unavailable:
    return Unavailable(reason or "the worker is disabled on this server (BATCHPLAN_WORKER_ENABLED=false)")


# The id the documented examples use, and the problems every route of a check may answer.
EXAMPLE_ID = "4f9c2b7e0d1a4c6b8e3f5a7c9d2e1b0a"
PROBLEMS: dict[int | str, dict[str, Any]] = {
    401: problem_response(
        "Missing or wrong API key.",
        {"no_key": problem_body(401, "http-401", "Unauthorized", API_KEY_HELP)},
    ),
    404: problem_response("No such check.", {"unknown_id": domain_problem(no_such_check(EXAMPLE_ID))}),
    429: problem_response(
        "The queue is full; see Retry-After.", {"queue_full": domain_problem(queue_full(16, 30))}
    ),
    503: problem_response(
        "The worker is disabled, or the server is shutting down.",
        {
            "disabled": domain_problem(_worker_disabled(None)),
            "shutting_down": domain_problem(shutting_down()),
        },
    ),
}
_FINISHED = problem_response(
    "Already finished.",
    {
        "already_finished": refusal(
            lambda: Job(EXAMPLE_ID, JobStatus.SUCCEEDED, "2026-01-01T00:00:00Z", {}).check_transition(
                JobStatus.CANCELLED
            )
        )
    },
)


# OpenAPI links: a check's lifecycle, POST -> GET -> DELETE, with the id the answer carries
# (clients and schemathesis' stateful testing follow them).
# The ids are the route functions' names (app.main.operation_id).
_GET_CHECK = "get_check"
_CANCEL_CHECK = "cancel_check"


def _link(operation: str, description: str) -> dict[str, Any]:
    return {
        "operationId": operation,
        "parameters": {"check_id": "$response.body#/id"},
        "description": description,
    }


_TO_GET = _link(_GET_CHECK, "The check by its id: its status, then its result.")
_TO_CANCEL = _link(_CANCEL_CHECK, "Cancel the check while it is queued or running.")


async def _service(request: Request) -> CheckService:
    # async: FastAPI runs a plain function dependency in a worker thread, a hop of 0.15 ms
    # of server CPU on every poll of a check for a lookup
    service: CheckService | None = request.app.state.checks
    if service is None:
        raise _worker_disabled(request.app.state.worker_error)
    return service


Service = Annotated[CheckService, Depends(_service)]


def _job_text(job: Job) -> str:
    """The job as `CheckJobOut` documents it (`job_json`), written as Starlette's JSONResponse
    writes JSON (`codec.json_text`), with its result spliced in as the job store holds it: the
    codec's JSON text of the rank's CheckResult, written in that form once when the check
    finished, and never parsed, validated or written again on the way out (response_model
    only documents it)."""
    stored = job.result_json
    if stored is None:
        return json_text(job_json(job))
    shown = job_json(dataclasses.replace(job, result_json=None))
    written = (
        f"{json_text(key)}:{stored if key == 'result' else json_text(value)}" for key, value in shown.items()
    )
    return "{" + ",".join(written) + "}"


def _job_response(job: Job, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_job_text(job).encode(), status_code, headers, media_type="application/json")


@router.post(
    "/checks",
    status_code=202,
    response_model=CheckJobOut,
    summary="Check a plan with a real DDP step",
    responses={
        202: {"links": {"GetCheck": _TO_GET, "CancelCheck": _TO_CANCEL}},
        **PROBLEM_RESPONSES,
        **PROBLEMS,
        422: problem_response(
            "Invalid or uncheckable request, naming the field (a plan's under /plan).",
            refused_plans(lambda body: CheckRequestIn.model_validate({"plan": body}).plan, "/plan"),
        ),
    },
)
async def create_check(
    body: Annotated[CheckRequestIn, Body(openapi_examples=CHECK_EXAMPLES)],
    service: Service,
    http: Request,
) -> Response:
    """Plan the request, run one data-parallel training step with `torch.distributed` on the
    warm ranks, and compare its gradient with a single-process gradient over the same
    global batch, next to deliberately wrong setups that the check must tell apart."""
    body = body.model_copy(update={"plan": await with_measured_lr(body.plan, http, "/plan")})
    submission = await asyncio.to_thread(service.prepare, body.to_core(), body.model_dump(mode="json"))
    job = await service.submit(submission)
    return _job_response(job, 202, {"Location": f"/v1/checks/{job.id}"})


@router.get("/checks", response_model=CheckListOut, summary="Recent checks, newest first", responses=PROBLEMS)
async def list_checks(
    service: Service, limit: Annotated[int, Query(ge=1, le=500)] = 50, status: StatusQuery | None = None
) -> Response:
    wanted = JobStatus(status) if status is not None else None
    jobs = await service.list(limit, wanted)
    listed = '{"checks":[' + ",".join(map(_job_text, jobs)) + "]}"
    return Response(listed.encode(), media_type="application/json")


@router.get(
    "/checks/{check_id}",
    response_model=CheckJobOut,
    summary="One check",
    responses={
        200: {
            "links": {"CancelCheck": _TO_CANCEL},
            "content": {"application/json": {"examples": FINISHED_CHECKS}},
        },
        **PROBLEMS,
    },
)
async def get_check(
    check_id: str,
    service: Service,
    wait: Annotated[
        float | None,
        Query(
            ge=0,
            le=MAX_WAIT_S,
            description="Seconds to wait for the check to finish before answering (at most "
            f"{MAX_WAIT_S:g}): the answer comes as soon as it has finished, or when the time is up "
            f"with its status then. 0 answers at once; without it, a check that has not finished "
            f"is answered within {HOLD_S:g} s (at once when it finishes meanwhile).",
            examples=[30],
        ),
    ] = None,
) -> Response:
    return _job_response(await service.get(check_id, HOLD_S if wait is None else wait))


@router.delete(
    "/checks/{check_id}",
    response_model=CheckJobOut,
    summary="Cancel a queued or running check",
    responses={200: {"links": {"GetCheck": _TO_GET}}, **PROBLEMS, 409: _FINISHED},
)
async def cancel_check(check_id: str, service: Service) -> Response:
    return _job_response(await service.cancel(check_id))


@router.get("/check-models", summary="The models a check can train", responses=PROBLEMS)
async def list_check_models(service: Service) -> CheckModelsOut:
    """The built-in synthetic model and those the operator registered
    (BATCHPLAN_CHECK_MODELS); a check request names one in `model`."""
    return CheckModelsOut.model_validate({"models": encode(service.describe_models())})


@router.get("/host", summary="What this worker can run", responses=PROBLEMS)
def get_host(request: Request) -> HostOut:
    service: CheckService | None = request.app.state.checks
    if service is None:
        return HostOut(
            worker_enabled=False, ready=False, processes_per_host=0, warm_processes=0, gpus=None, backends=[]
        )
    return HostOut.model_validate(encode(service.host()) | {"exposure": exposure(request.app.state.settings)})
