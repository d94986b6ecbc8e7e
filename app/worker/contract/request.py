"""A check request as JSON (the body of POST /v1/checks) to core types, without pydantic,
so that the rank program under torchrun takes the same input as the HTTP API.

The web layer validates with its schema first; here the core's own checks apply. The plan
request inside is read by app.core.plan_request, as the HTTP schema's is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from app.core.model_registry import SYNTHETIC
from app.core.plan_request import plan_request
from app.core.planner import plan
from app.worker.contract.spec import CheckSpec, SpecError, spec_from_plan

# Steps a registered model's noise scale is measured over unless the request says otherwise.
DEFAULT_NOISE_STEPS = 8


def check_options(data: dict[str, Any], *, registered: bool) -> dict[str, Any]:
    """The CheckSpec fields beyond the plan: the model, the noise-scale steps and the
    micro-batch search. A registered model measures its noise scale by default (`None`
    here: `with_options` decides once the plan is known)."""
    noise = data.get("noise_scale")
    steps: int | None
    if noise is None:
        steps, rate = (None if registered else 0), 0.0
    else:
        steps, rate = int(noise.get("steps", DEFAULT_NOISE_STEPS)), float(noise.get("learning_rate", 0.0))
    fit = data.get("fit_micro_batch")
    return {
        "model": data.get("model") or SYNTHETIC,
        "noise_steps": steps,
        "noise_learning_rate": rate,
        "fit": dict(fit) if fit else None,
        "plan_request": data["plan"] if fit else None,
        # Only when asked: otherwise the plan decides (tokens under loss_normalization token).
        **({"workload": data["workload"]} if data.get("workload") else {}),
    }


def with_options(spec: CheckSpec, options: dict[str, Any]) -> CheckSpec:
    """`spec` with `check_options`; the default noise measurement only where it can be made
    (two replicas or two accumulation steps: a small batch and a big one)."""
    if options.get("workload", spec.workload) == "tokens":
        options = {**options, **tokens_options(options)}
    if options.get("noise_steps") is None:
        measurable = spec.data_parallel_size > 1 or spec.gradient_accumulation_steps > 1
        options = {**options, "noise_steps": DEFAULT_NOISE_STEPS if measurable else 0}
    return dataclasses.replace(spec, **options)


def tokens_options(options: dict[str, Any]) -> dict[str, Any]:
    """The tokens workload runs one step and its controls: it measures no noise scale and
    searches no micro-batch, so asking for either is an error, not silently skipped."""
    if options.get("fit"):
        raise SpecError("fit_micro_batch is not available with the tokens workload", "/fit_micro_batch")
    if options.get("noise_steps"):
        raise SpecError(
            "noise_scale is not measured by the tokens workload: give steps 0", "/noise_scale/steps"
        )
    return {"noise_steps": 0}


def spec_from_request(data: dict[str, Any], *, registered: bool | None = None) -> CheckSpec:
    request = plan_request(data["plan"])
    spec = spec_from_plan(
        plan(request),
        dtype=data.get("dtype", "float64"),
        seed=data.get("seed", 0),
        backend=data.get("backend", "auto"),
        dataset=request.dataset,
    )
    if registered is None:
        registered = (data.get("model") or SYNTHETIC) != SYNTHETIC
    return with_options(spec, check_options(data, registered=registered))


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
    fresh = spec_from_request({"plan": data, "dtype": spec.dtype, "seed": spec.seed, "backend": spec.backend})
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
