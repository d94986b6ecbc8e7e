"""POST /v1/plans: a thin translation between HTTP and the core planner."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends

from app.api.deps import require_json
from app.api.problems import PROBLEM_RESPONSES
from app.core.planner import plan
from app.schemas.plans import EXAMPLES, PROBLEM_EXAMPLE, PlanOut, PlanRequestIn, ProblemOut

router = APIRouter(prefix="/v1", tags=["plans"])

PLAN_RESPONSES = {
    **PROBLEM_RESPONSES,
    422: {"model": ProblemOut, "description": "Invalid or infeasible values, with suggestions.",
          "content": {"application/problem+json": {"example": PROBLEM_EXAMPLE}}},
}


@router.post("/plans", summary="Plan a batch split", responses=PLAN_RESPONSES,
             dependencies=[Depends(require_json)])
def create_plan(
    request: Annotated[PlanRequestIn, Body(openapi_examples=EXAMPLES)],
) -> PlanOut:
    """Turn a cluster and a wanted global batch into per-replica micro-batches,
    gradient-accumulation steps, sampler settings, loss scales and a scaled learning rate.
    """
    return PlanOut.model_validate(plan(request.to_core()))
