"""Answers people can paste: plan exports, training schedules (with charts) and elastic plans.

Thin: every number comes from app.core (exports, schedule, elastic); charts from app.charts.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from app.api.chart_response import WARNINGS_HEADER, chart_response
from app.api.json_body import JsonBodyRoute
from app.api.measured_lr import with_measured_lr
from app.api.plans import refused_plans
from app.api.problems import PROBLEM_RESPONSES, SUGGESTION_CHECKS, problem_response, refusal
from app.core.errors.domain import PlanError
from app.core.errors.problems import Problem
from app.core.exports.parts.export_types import ExportInput, ExportUnsupported
from app.core.exports.registry import EXPORTERS, plan_and_export, unknown_format
from app.core.learning_rate.schedule import schedule
from app.core.planner import plan
from app.core.records.plan import Plan
from app.core.records.schedule import Schedule
from app.core.resume.elastic import elastic_plan
from app.core.resume.ramp import with_resume
from app.schemas.checked_options import checked_option_errors
from app.schemas.elastic import (
    ELASTIC_REQUEST_EXAMPLE,
    ElasticCountOut,
    ElasticLearningRateOut,
    ElasticOut,
    ElasticRequestIn,
)
from app.schemas.examples import PLAN_EXAMPLES, plan_example
from app.schemas.exports import SCHEDULE_REQUEST_EXAMPLE, ExportOptionsIn, ScheduleOut, ScheduleRequestIn
from app.schemas.plan_requests import PlanRequestIn

# Only python writes a packed loop yet (the others refuse at /packing): Swagger shows what
# every format exports.
EXAMPLES = {name: example for name, example in PLAN_EXAMPLES.items() if "packing" not in example["value"]}

router = APIRouter(prefix="/v1/plans", tags=["exports"], route_class=JsonBodyRoute)

_UNPROCESSABLE = "Invalid or infeasible values, or a plan the format cannot express, with suggestions."


def _one_example(name: str, summary: str, value: Any) -> Any:
    """The request body of a route that Swagger shows with this one example."""
    return Body(openapi_examples={name: {"summary": summary, "value": value}})


def _exported(fmt: str, body: dict[str, Any]) -> None:
    request = PlanRequestIn.model_validate(body).to_core()
    EXPORTERS[fmt](ExportInput(request, plan(request)))


def _export_refusals() -> dict[str, Problem]:
    return {
        **refused_plans(),
        "uneven_for_deepspeed": refusal(lambda: _exported("deepspeed", plan_example("mixed"))),
        "uneven_needs_two_changes": refusal(
            lambda: _exported("hf-trainer", {**plan_example("mixed"), "global_batch_size": 1001})
        ),
    }


def _export_examples() -> dict[int | str, dict[str, Any]]:
    """Response examples are real exports of the ImageNet request example, or of the language
    model example for a format that cannot train that recipe (torchtitan: Adam only)."""
    inputs = []
    for name in ("dataset_and_lr", "language_model"):
        request = PlanRequestIn.model_validate(EXAMPLES[name]["value"]).to_core()
        inputs.append(ExportInput(request, plan(request), ExportOptionsIn().to_core()))
    content: dict[str, dict[str, Any]] = {}
    for fmt, exporter in EXPORTERS.items():
        try:
            out = exporter(inputs[0])
        except ExportUnsupported:
            out = exporter(inputs[1])
        content.setdefault(out.media_type, {"examples": {}})["examples"][fmt] = {
            "summary": f"{fmt} ({out.filename})",
            "value": out.text,
        }
    return {
        200: {"description": "The export, ready to paste or save.", "content": content},
        404: problem_response(
            "Unknown format; the detail lists the known ones.",
            {"unknown_format": refusal(lambda: _raise(unknown_format("ray")))},
        ),
        **PROBLEM_RESPONSES,
        422: problem_response(_UNPROCESSABLE, _export_refusals()),
    }


def _raise(err: Exception) -> None:
    raise err


@router.post(
    "/export/{format}",
    summary="Export a plan for a launcher or trainer",
    responses=_export_examples(),
    response_class=Response,
)
async def export_plan(
    format: Annotated[
        str,
        # Documented as an enum for Swagger and ReDoc, received as a str: an unknown format
        # still reaches the handler and gets the 404 that lists the known ones.
        Path(
            description="The format to write.",
            json_schema_extra={"enum": list(EXPORTERS)},
            openapi_examples={"torchrun": {"summary": "A torchrun launch script", "value": "torchrun"}},
        ),
    ],
    request: Annotated[PlanRequestIn, Body(openapi_examples=EXAMPLES)],
    options: Annotated[ExportOptionsIn, Query()],
    http: Request,
) -> Response:
    """The same body as POST /v1/plans; the answer is text to paste: `torchrun` and `slurm`
    scripts, a Kubeflow `kubernetes` PyTorchJob, a `deepspeed` config, an `accelerate` config,
    `hf-trainer` TrainingArguments, `lightning` Trainer arguments, or a `python` DDP loop.

    Plans with uneven per-replica micro-batches are refused (422, with the nearest even split
    in `suggestions`) by formats that take one batch size for every process: deepspeed,
    accelerate, hf-trainer, lightning. torchrun, slurm and python carry the per-rank table.
    """
    if format not in EXPORTERS:
        raise unknown_format(format)
    request = await with_measured_lr(request, http)
    out = plan_and_export(format, request.to_core(), options.to_core())
    return Response(
        out.text,
        media_type=out.media_type,
        headers={"Content-Disposition": f'inline; filename="{out.filename}"'},
    )


def _checked_options(request: Request, body: Any, errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    fmt = request.path_params.get("format", "")
    return checked_option_errors(fmt, body, dict(request.query_params), errors)


SUGGESTION_CHECKS["/v1/plans/export/{format}"] = _checked_options


def _scheduled(body: ScheduleRequestIn) -> tuple[Plan, Schedule]:
    request, spec = body.plan.to_core(), body.to_core()
    # A ramp-up run resumes by consumed samples along the ramp (app.core.resume.ramp), not as
    # the plan alone would count them.
    try:
        the_plan = plan(dataclasses.replace(request, resume=None) if spec.rampup else request)
    except PlanError as err:
        raise err.under("/plan") from None
    return the_plan, with_resume(schedule(the_plan, spec), the_plan, spec, request.resume)


_SCHEDULE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The series as JSON, or with `?format=png|svg` a chart of it.",
        "headers": {
            WARNINGS_HEADER: {
                "description": "With a chart: the answer's `warnings` (the plan's, then the schedule's "
                "own), as a JSON array of strings.",
                "schema": {"type": "string"},
            }
        },
        "content": {
            "image/png": {"schema": {"type": "string", "format": "binary"}},
            "image/svg+xml": {"schema": {"type": "string"}},
        },
    },
    **PROBLEM_RESPONSES,
    422: problem_response(
        "Invalid or infeasible values, in the plan (under /plan) or the ramp-up, with suggestions.",
        {
            **refused_plans(lambda body: ScheduleRequestIn.model_validate({"plan": body}).plan, "/plan"),
            # Megatron's rule that batchplan checks up front: every stage in whole micro-batches.
            "rampup_not_in_whole_micro_batches": refusal(
                lambda: _scheduled(
                    ScheduleRequestIn.model_validate(
                        {**SCHEDULE_REQUEST_EXAMPLE, "plan": plan_example("dataset_and_lr")}
                    )
                )
            ),
        },
    ),
}


@router.post(
    "/schedule",
    summary="Batch ramp-up and learning-rate schedule of a plan",
    responses=_SCHEDULE_RESPONSES,
    response_model=ScheduleOut,
)
async def plan_schedule(
    body: Annotated[
        ScheduleRequestIn,
        _one_example("rampup", "ImageNet, batch ramp-up 128 to 512", SCHEDULE_REQUEST_EXAMPLE),
    ],
    http: Request,
    format: Annotated[Literal["json", "png", "svg"], Query(description="json, or a chart")] = "json",
) -> Any:
    """Step by step: the global batch and accumulation under Megatron-style ramp-up
    (`--rampup-batch-size start increment samples`) and the lr (linear warmup from the plan's
    `warmup_start_lr`, then cosine or linear decay to `min_lr`). The series is downsampled to
    at most `max_points` points, keeping the steps where the batch changes."""
    body = body.model_copy(update={"plan": await with_measured_lr(body.plan, http, "/plan")})
    the_plan, result = _scheduled(body)
    if format == "json":
        return ScheduleOut.model_validate(result)
    from app.charts import schedule_chart  # matplotlib loads only when a chart is asked for

    title = (
        f"{the_plan.world_size} GPUs, data-parallel {the_plan.data_parallel_size}, "
        f"global batch {the_plan.global_batch_size}, {result.train_steps} steps"
    )
    return await chart_response(schedule_chart, result, format, title, result.warnings)


@router.post(
    "/elastic",
    summary="One global batch for a range of GPU counts (DeepSpeed elasticity)",
    responses={
        **PROBLEM_RESPONSES,
        422: problem_response(
            "Invalid values, or a GPU range that no candidate batch divides.",
            {
                "no_gpu_count_divides": refusal(
                    lambda: elastic_plan(
                        ElasticRequestIn.model_validate(
                            {
                                "min_gpus": 7,
                                "max_gpus": 7,
                                "micro_batch_sizes": [2],
                                "max_global_batch_size": 8,
                            }
                        ).to_core()
                    )
                )
            },
        ),
    },
)
async def plan_elastic(
    body: Annotated[
        ElasticRequestIn, _one_example("deepspeed", "DeepSpeed's own example", ELASTIC_REQUEST_EXAMPLE)
    ],
    http: Request,
) -> ElasticOut:
    """DeepSpeed's elasticity v0.1 search: the candidate global batch (at most
    `max_global_batch_size`) that the most data-parallel GPU counts in [min_gpus, max_gpus]
    divide into whole micro-batches; for each count, the largest allowed micro-batch and the
    accumulation. The lr stays fixed across counts because the global batch does."""
    body = await with_measured_lr(body, http)
    result = await run_in_threadpool(elastic_plan, body.to_core())
    lr = result.learning_rate
    return ElasticOut(
        global_batch_size=result.global_batch_size,
        valid_gpus=list(result.valid_gpus),
        counts=[ElasticCountOut.model_validate(c) for c in result.counts],
        candidates=list(result.candidates),
        coverage=result.coverage,
        learning_rate=ElasticLearningRateOut.model_validate(lr) if lr else None,
        warnings=list(result.warnings),
        deepspeed={
            "elasticity": {
                "enabled": True,
                "max_train_batch_size": body.max_global_batch_size,
                "micro_batch_sizes": body.micro_batch_sizes,
                "min_gpus": body.min_gpus,
                "max_gpus": body.max_gpus,
                "prefer_larger_batch": body.prefer_larger,
                "version": 0.1,
            }
        },
    )
