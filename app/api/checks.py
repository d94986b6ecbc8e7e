"""The worker's routes: gradient checks of a plan with real torch.distributed, and the host."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Query, Request, Response

from app.api.deps import require_api_key
from app.api.problems import PROBLEM_RESPONSES
from app.core.errors import Unavailable
from app.core.model_registry import SYNTHETIC
from app.schemas.checks import (
    CHECK_EXAMPLES,
    CheckJobOut,
    CheckListOut,
    CheckModelsOut,
    CheckRequestIn,
    HostOut,
    JobStatus,
)
from app.schemas.problem import ProblemOut
from app.worker.request import check_options
from app.worker.service import CheckService

router = APIRouter(prefix="/v1", tags=["checks"], dependencies=[Depends(require_api_key)])

_PROBLEMS = {
    **PROBLEM_RESPONSES,
    401: {"model": ProblemOut, "description": "Missing or wrong API key."},
    404: {"model": ProblemOut, "description": "No such check."},
    422: {"model": ProblemOut, "description": "Invalid or uncheckable request, naming the field."},
    429: {"model": ProblemOut, "description": "The queue is full; see Retry-After."},
    503: {"model": ProblemOut, "description": "The worker is disabled, or the server is shutting down."},
}


def _service(request: Request) -> CheckService:
    service: CheckService | None = request.app.state.checks
    if service is None:
        reason = request.app.state.worker_error
        raise Unavailable(reason or "the worker is disabled on this server (BATCHPLAN_WORKER_ENABLED=false)")
    return service


Service = Annotated[CheckService, Depends(_service)]


@router.post(
    "/checks",
    status_code=202,
    summary="Check a plan with a real DDP step",
    responses=_PROBLEMS,
)
async def create_check(
    body: Annotated[CheckRequestIn, Body(openapi_examples=CHECK_EXAMPLES)],
    service: Service,
    response: Response,
) -> CheckJobOut:
    """Plan the request, run one data-parallel training step with `torch.distributed` on the
    warm ranks, and compare its gradient with a single-process gradient over the same
    global batch, next to deliberately wrong setups that the check must tell apart."""
    stored = body.model_dump(mode="json")
    options = check_options(stored, registered=body.model != SYNTHETIC)
    rendezvous = body.rendezvous.model_dump() if body.rendezvous else None
    spec, timeout = await asyncio.to_thread(
        service.prepare,
        body.plan.to_core(),
        dtype=body.dtype,
        seed=body.seed,
        backend=body.backend,
        timeout_s=body.timeout_s,
        rendezvous=rendezvous,
        options=options,
    )
    job = await service.submit(stored, spec, timeout, rendezvous)
    response.headers["Location"] = f"/v1/checks/{job.id}"
    return CheckJobOut.from_job(job)


@router.get("/checks", summary="Recent checks, newest first", responses=_PROBLEMS)
async def list_checks(
    service: Service, limit: Annotated[int, Query(ge=1, le=500)] = 50, status: JobStatus | None = None
) -> CheckListOut:
    return CheckListOut(checks=[CheckJobOut.from_job(j) for j in await service.list(limit, status)])


@router.get("/checks/{check_id}", summary="One check", responses=_PROBLEMS)
async def get_check(check_id: str, service: Service) -> CheckJobOut:
    job = await service.get(check_id)
    return CheckJobOut.from_job(job)


@router.delete(
    "/checks/{check_id}",
    summary="Cancel a queued or running check",
    responses={**_PROBLEMS, 409: {"model": ProblemOut, "description": "Already finished."}},
)
async def cancel_check(check_id: str, service: Service) -> CheckJobOut:
    job = await service.cancel(check_id)
    return CheckJobOut.from_job(job)


@router.get("/check-models", summary="The models a check can train", responses=_PROBLEMS)
async def check_models(service: Service) -> CheckModelsOut:
    """The built-in synthetic model and those the operator registered
    (BATCHPLAN_CHECK_MODELS); a check request names one in `model`."""
    return CheckModelsOut.model_validate({"models": service.describe_models()})


@router.get("/host", summary="What this worker can run", responses=_PROBLEMS)
def host(request: Request) -> HostOut:
    service: CheckService | None = request.app.state.checks
    if service is None:
        return HostOut(
            worker_enabled=False, ready=False, processes_per_host=0, warm_processes=0, gpus=None, backends=[]
        )
    return HostOut.model_validate(service.host())
