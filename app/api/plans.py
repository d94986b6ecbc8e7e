"""POST /v1/plans: a thin translation between HTTP and the core planner."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request, Response
from fastapi.routing import APIRoute

from app.api.json_body import JsonBodyRoute
from app.api.measured_lr import with_measured_lr
from app.api.problems import PROBLEM_RESPONSES, problem_response, refusal
from app.core.errors.domain import PlanError
from app.core.errors.problems import Problem
from app.core.planner import plan
from app.schemas.examples import INFEASIBLE_PLAN, OUT_OF_RANGE_PLAN, PLAN_EXAMPLES, STREAM_PLAN_EXAMPLES
from app.schemas.plan_requests import PlanRequestIn
from app.schemas.plan_responses import PlanOut, plan_json

router = APIRouter(prefix="/v1", tags=["plans"], route_class=JsonBodyRoute)
SHOWN_EXAMPLES = {**PLAN_EXAMPLES, **STREAM_PLAN_EXAMPLES}


def _response_examples() -> dict[str, Any]:
    """Swagger's response examples are the planner's own answers to the request examples,
    so they can never drift from what the service returns."""
    out = {}
    for name, example in SHOWN_EXAMPLES.items():
        request = PlanRequestIn.model_validate(example["value"]).to_core()
        out[name] = {
            "summary": example["summary"],
            "value": PlanOut.model_validate(plan(request)).model_dump(mode="json"),
        }
    return out


def refused_plans(
    validate: Callable[[dict[str, Any]], PlanRequestIn] = PlanRequestIn.model_validate, prefix: str = ""
) -> dict[str, Problem]:
    """The 422s of a plan request, with the suggestions the service really gives: an infeasible
    split and a value out of range. `validate` reads a plan request as the operation's body
    nests it, at `prefix` (a check's or a schedule's `/plan`)."""

    def planned(body: dict[str, Any]) -> None:
        request = validate(body)
        try:
            plan(request.to_core())
        except PlanError as err:
            raise err.under(prefix) from None

    return {
        "infeasible": refusal(lambda: planned(INFEASIBLE_PLAN)),
        "out_of_range": refusal(lambda: planned(OUT_OF_RANGE_PLAN)),
    }


PLAN_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/json": {"examples": _response_examples()}}},
    **PROBLEM_RESPONSES,
    422: problem_response("Invalid or infeasible values, with suggestions.", refused_plans()),
}


@router.post(
    "/plans",
    summary="Plan a batch split",
    response_model=PlanOut,
    responses=PLAN_RESPONSES,
)
async def create_plan(
    request: Annotated[PlanRequestIn, Body(openapi_examples=SHOWN_EXAMPLES)],
    http: Request,
) -> Response:
    """Turn a cluster and a wanted global batch into per-replica micro-batches,
    gradient-accumulation steps, sampler settings, loss scales and a scaled learning rate;
    given a measured `gradient_noise_scale`, also the global batch's step and sample
    efficiency against the critical batch (`efficiency`).

    Runs on the event loop: a plan takes well under a millisecond (bench/bench_core.py),
    less than a thread hand-off would cost. The JSON is written straight from the core's
    dataclass (`plan_json`), the hot path's largest saving (bench/bench_http.py).
    """
    # Most valid bodies never get here: app.api.plan_fast_path answers them first, with
    # plan_answer and this response's headers (tests/api/test_plan_fast_path.py). A body that
    # names an lr-scaling probe by id does: its numbers are looked up first.
    request = await with_measured_lr(request, http)
    return Response(plan_answer(request), media_type="application/json")


def plan_answer(request: PlanRequestIn) -> bytes:
    """The 200 body of a validated plan request, for the route and its fast path alike. The
    JSON is written straight from the core's dataclass (`plan_json`)."""
    return plan_json(plan(request.to_core()))


def plan_route() -> APIRoute:
    """The route of POST /v1/plans, as routing puts it in scope["route"]."""
    return next(r for r in router.routes if isinstance(r, APIRoute) and r.endpoint is create_plan)
