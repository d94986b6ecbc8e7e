"""A check request as JSON (the body of POST /v1/checks, the rank program's --request) to core
types, and the one builder of the spec every rank runs: HTTP admission, the rank program
under torchrun and the local CLI take the same input and refuse the same things.

The web layer validates with its schema first; here the core's own checks apply, without
pydantic. The plan request inside is read by app.core.plan_request, as the HTTP schema's is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.contract.check_options import DEFAULT_BACKEND, DEFAULT_DTYPE, DEFAULT_NOISE_STEPS, DEFAULT_STEPS
from app.contract.model_registry import SYNTHETIC
from app.contract.options import FitOptions, NoiseOptions, Rendezvous
from app.contract.run_request import refuse_for_a_run, run_plan_json
from app.contract.spec import CheckSpec, SpecError, spec_from_plan
from app.contract.targets import missing_module
from app.core.errors import InvalidValue, PlanError, field_key
from app.core.plan_request import plan_request
from app.core.plan_types import PlanRequest
from app.core.planner import plan


@dataclass(frozen=True, slots=True)
class CheckRequest:
    plan: PlanRequest
    plan_json: dict[str, Any]  # the plan as sent: a micro-batch search re-plans from it
    model: str = SYNTHETIC
    noise_scale: NoiseOptions | None = None  # None: measured by default for a registered model
    fit_micro_batch: FitOptions | None = None
    backend: str = DEFAULT_BACKEND
    dtype: str = DEFAULT_DTYPE
    seed: int = 0
    timeout_s: float | None = None
    rendezvous: Rendezvous | None = None
    workload: str | None = None  # None: the plan decides (tokens under loss_normalization token)
    steps: int = DEFAULT_STEPS  # optimizer steps: above 1, a run of the plan's recipe (run_request.py)


def check_request(data: Mapping[str, Any]) -> CheckRequest:
    noise, fit, rendezvous = data.get("noise_scale"), data.get("fit_micro_batch"), data.get("rendezvous")
    return CheckRequest(
        plan=plan_request(data["plan"]),
        plan_json=dict(data["plan"]),
        model=data.get("model") or SYNTHETIC,
        noise_scale=NoiseOptions.from_json(noise) if noise is not None else None,
        fit_micro_batch=FitOptions.from_json(fit) if fit else None,
        backend=data.get("backend") or DEFAULT_BACKEND,
        dtype=data.get("dtype") or DEFAULT_DTYPE,
        seed=int(data.get("seed") or 0),
        timeout_s=data.get("timeout_s"),
        rendezvous=Rendezvous.from_json(rendezvous) if rendezvous else None,
        workload=data.get("workload"),
        steps=int(data.get("steps") or DEFAULT_STEPS),
    )


def build_spec(request: CheckRequest, *, factory: str | None = None, factory_flag: bool = False) -> CheckSpec:
    """What every rank runs for `request`. Raises the core's errors with the pointer of the
    check request's field (a planner error under /plan).

    `factory`: the model's `package.module:factory` where the caller knows it (a registered
    name's, or the command line's --model-factory with `factory_flag`); a module that is not
    there is refused here, before any rank starts, rather than by every rank's traceback."""
    if factory is not None:
        _refuse_a_missing_factory(request.model, factory, factory_flag)
    try:
        planned = plan(request.plan)
        dataset, run_plan = request.plan.dataset, None
        if request.steps > 1:
            # A run trains the plan with a dataset and a recipe: the request's, or defaults.
            run_plan = run_plan_json(request.plan_json, planned, request.steps, request.seed)
            run_request = plan_request(run_plan)
            planned, dataset = plan(run_request), run_request.dataset
    except PlanError as err:
        raise err.under("/plan") from None
    fit = request.fit_micro_batch
    if run_plan is not None:
        refuse_for_a_run(planned, request.steps, fit=fit is not None)
    spec = spec_from_plan(
        planned, dtype=request.dtype, seed=request.seed, backend=request.backend, dataset=dataset
    )
    spec = dataclasses.replace(
        spec,
        model=request.model,
        fit=fit,
        plan_request=request.plan_json if fit else None,
        workload=request.workload or spec.workload,
        steps=request.steps,
        run_plan=run_plan,
    )
    if spec.workload == "tokens":
        _refuse_for_tokens(spec, request.noise_scale)
    if spec.mesh is not None:
        _refuse_for_a_mesh(spec, request.noise_scale)
    return _with_noise(spec, request.noise_scale)


def echoed(body: dict[str, Any], spec: CheckSpec) -> dict[str, Any]:
    """The request as a job shows it: as sent, with the workload that runs where the plan
    chose it (a token-normalised plan runs tokens), so that no one reads a null and guesses."""
    return {**body, "workload": spec.workload}


def _refuse_a_missing_factory(model: str, factory: str, flag: bool) -> None:
    why = missing_module(factory)
    if why is None:
        return
    if flag:  # a command-line flag, not a field of the request: no pointer
        raise SpecError(
            f"--model-factory {factory}: {why} in this environment; install its package here or add "
            f"its folder to PYTHONPATH",
            "",
        )
    raise SpecError(
        f"check model {model!r} cannot be built here: its factory {factory}: {why}; its package must "
        f"be installed where the ranks run (BATCHPLAN_CHECK_MODELS registers it)",
        "/model",
    )


def _with_noise(spec: CheckSpec, asked: NoiseOptions | None) -> CheckSpec:
    """The noise measurement asked for; by default a registered model's, where it can be made
    (two replicas or two accumulation steps: a small batch and a big one) and where the check
    kind measures it (not the tokens or mesh checks)."""
    if asked is not None:
        return dataclasses.replace(spec, noise_steps=asked.steps, noise_learning_rate=asked.learning_rate)
    measurable = spec.data_parallel_size > 1 or spec.gradient_accumulation_steps > 1
    measured = spec.model != SYNTHETIC and measurable and spec.workload != "tokens" and spec.mesh is None
    return dataclasses.replace(spec, noise_steps=DEFAULT_NOISE_STEPS if measured else 0)


def _refuse_for_tokens(spec: CheckSpec, noise: NoiseOptions | None) -> None:
    """The tokens workload runs one step and its controls: it measures no noise scale and
    searches no micro-batch, so asking for either is an error, not silently skipped."""
    if spec.fit is not None:
        raise SpecError("fit_micro_batch is not available with the tokens workload", "/fit_micro_batch")
    if noise is not None and noise.steps:
        raise SpecError(
            "noise_scale is not measured by the tokens workload: give steps 0", "/noise_scale/steps"
        )


def _refuse_for_a_mesh(spec: CheckSpec, noise: NoiseOptions | None) -> None:
    """A mesh check measures the gradient, not the noise scale or the largest micro-batch:
    those run on DDP checks (a default noise measurement is dropped, an asked-for one
    refused). The mesh check trains sample models: a token plan's would prove something else."""
    if spec.workload == "tokens":
        raise SpecError(
            "the tokens workload runs on data-parallel replicas only; a plan with a device mesh "
            "(tensor, pipeline, context or data_parallel_shard above 1) is checked with the "
            "synthetic workload: drop workload tokens, or check the data-parallel part alone",
            "/workload",
        )
    if spec.fit is not None:
        raise InvalidValue(
            "the micro-batch search runs on a DDP check: drop fit_micro_batch, or search with "
            "tensor, pipeline and context 1 and data_parallel_shard 1, then check the mesh",
            pointer="/fit_micro_batch",
        )
    if noise is not None and noise.steps:
        pointer = "/noise_scale/steps"
        raise InvalidValue(
            "the gradient noise scale is measured on a DDP check (it needs every replica's own "
            "gradient): send noise_scale.steps 0 with a mesh, or measure it with data_parallel_shard 1 "
            "and no model parallelism",
            pointer=pointer,
            suggestions={field_key(pointer): [0]},
        )


def replan(spec: CheckSpec, max_micro_batch_size: int) -> CheckSpec:
    """The same global batch with no micro-batch above `max_micro_batch_size`: accumulation
    grows instead of the batch shrinking. Raises the core's PlanError when no such plan
    exists (its message names the field and suggests values)."""
    if spec.plan_request is None:
        raise ValueError("the spec has no plan request to re-plan")
    data = _without_nulls(spec.plan_request)
    cap = max_micro_batch_size
    micro = data.get("micro_batch_size")
    if micro is not None and micro > cap:
        data.pop("micro_batch_size")
        data.pop("gradient_accumulation_steps", None)
    data["global_batch_size"] = spec.global_batch_size
    data["max_micro_batch_size"] = min(data.get("max_micro_batch_size") or cap, cap)
    for group in data["topology"].get("node_groups") or []:
        group["max_micro_batch_size"] = min(group.get("max_micro_batch_size") or cap, cap)
    request = {"plan": data, "dtype": spec.dtype, "seed": spec.seed, "backend": spec.backend}
    fresh = build_spec(check_request({**request, "workload": spec.workload}))
    return dataclasses.replace(
        fresh,
        model=spec.model,
        noise_steps=spec.noise_steps,
        noise_learning_rate=spec.noise_learning_rate,
        fit=spec.fit,
        plan_request=data,
    )


def _without_nulls(value: Any) -> Any:
    """A deep copy without null fields: the re-planned request reads as one a user would send."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
