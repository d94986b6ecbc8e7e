"""A check request in core types, and the one builder of the spec every rank runs: HTTP
admission (`CheckRequestIn.to_core()`), the rank program under torchrun and the local CLI
(`check_request`, from JSON) build the same request and refuse the same things.

A request is validated once, where it comes in: the HTTP schema, or `check_request` for JSON
that did not come through it (its choices against the same Literal types the schema takes,
its ranges against the table the schema reads, app.contract.limits). From here on the records
are trusted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, get_args

from app.contract.check_options import (
    DEFAULT_BACKEND,
    DEFAULT_DTYPE,
    DEFAULT_NOISE_STEPS,
    DEFAULT_STEPS,
    Backend,
    CheckWorkload,
    DType,
)
from app.contract.codec import decode
from app.contract.kinds.lr_scaling import LrScalingOptions
from app.contract.kinds.part import Trained
from app.contract.kinds.registry import REQUEST_PARTS
from app.contract.kinds.resume import ResumeOptions
from app.contract.kinds.throughput import ThroughputOptions
from app.contract.limits import CHECK_LIMITS
from app.contract.model_registry import SYNTHETIC
from app.contract.options import FitOptions, NoiseOptions, Rendezvous
from app.contract.packed import PACKED_STEPS, collator_refusal
from app.contract.spec import CheckSpec, spec_from_plan
from app.contract.spec_error import SpecError
from app.contract.targets import missing_module
from app.core.errors.domain import InvalidValue, PlanError, field_key
from app.core.planner import plan
from app.core.records.plan_request import NodeGroup, PackingMode, PackingSpec, PlanRequest
from app.core.request.parse import plan_request


@dataclass(frozen=True, slots=True)
class CheckOptions:
    """Everything a check request holds besides its plan, each key as the JSON names it."""

    model: str = SYNTHETIC
    noise_scale: NoiseOptions | None = None  # None: measured by default for a registered model
    fit_micro_batch: FitOptions | None = None
    backend: Backend = DEFAULT_BACKEND
    dtype: DType = DEFAULT_DTYPE
    seed: int = 0
    timeout_s: float | None = None
    rendezvous: Rendezvous | None = None
    workload: CheckWorkload | None = None  # None: the plan decides (tokens under loss_normalization token)
    steps: int = DEFAULT_STEPS  # optimizer steps: above 1, a run of the plan's recipe (kinds/run.py)
    # A kind's options, one line a kind (app.contract.kinds), each None when not asked.
    resume: ResumeOptions | None = None  # the run checkpointed and resumed on other replicas
    throughput: ThroughputOptions | None = None  # measure the micro-step's curve
    lr_scaling: LrScalingOptions | None = None  # an lr-scaling probe


@dataclass(frozen=True, slots=True)
class CheckRequest:
    plan: PlanRequest
    options: CheckOptions = CheckOptions()

    @property
    def model(self) -> str:
        return self.options.model


_CHOICES = {"backend": Backend, "dtype": DType, "workload": CheckWorkload}


def check_request(data: Mapping[str, Any]) -> CheckRequest:
    """A check request's JSON that no HTTP schema read (the rank program's --request, a local
    check): its choices and its ranges checked here, once."""
    for key, kind in _CHOICES.items():
        if data.get(key) is not None and data[key] not in get_args(kind):
            raise SpecError(f"{key} must be one of {', '.join(get_args(kind))}", f"/{key}")
    data = CHECK_LIMITS.check(data)
    if not isinstance(data.get("plan"), Mapping):
        raise SpecError("give the plan: a plan request, as POST /v1/plans takes it", "/plan")
    try:
        request = plan_request(data["plan"])
    except PlanError as err:
        raise err.under("/plan") from None
    except (KeyError, TypeError, ValueError) as err:  # a shape the parser's own refusals do not name
        raise SpecError(
            f"the plan is not a plan request ({type(err).__name__}: {err}): POST it to /v1/plans, "
            f"whose schema names each field's problem",
            "/plan",
        ) from None
    given = {k: v for k, v in data.items() if k != "plan" and v is not None}
    return CheckRequest(request, decode(CheckOptions, _without_nulls(given)))


def build_spec(request: CheckRequest, *, factory: str | None = None, factory_flag: bool = False) -> CheckSpec:
    """What every rank runs for `request`. Raises the core's errors with the pointer of the
    check request's field (a planner error under /plan).

    `factory`: the model's `package.module:factory` where the caller knows it (a registered
    name's, or the command line's --model-factory with `factory_flag`); a module that is not
    there is refused here, before any rank starts, rather than by every rank's traceback.

    Each kind has its say through its part (kinds/registry.py), in order: what the check
    trains, before the first step's spec is built from it; then its fields of the spec."""
    options = request.options
    if factory is not None:
        _refuse_a_missing_factory(options.model, factory, factory_flag)
    try:
        trained = Trained(request.plan, plan(request.plan))
    except PlanError as err:
        raise err.under("/plan") from None
    for part in REQUEST_PARTS:
        trained = part.trains(request, trained)
    fit = options.fit_micro_batch
    spec = spec_from_plan(
        trained.plan,
        dtype=options.dtype,
        seed=options.seed,
        backend=options.backend,
        dataset=trained.request.dataset,
    )
    spec = dataclasses.replace(
        spec,
        model=options.model,
        fit=fit,
        plan_request=request.plan if fit else None,
        workload=options.workload or spec.workload,
        steps=options.steps,
    )
    for part in REQUEST_PARTS:
        spec = part.apply(request, trained, spec)
    if request.plan.packing is not None:
        spec = _packed(spec, request.plan.packing)
    if spec.workload == "tokens":
        _refuse_for_tokens(spec, options.noise_scale)
    if spec.mesh is not None:
        _refuse_for_a_mesh(spec, options.noise_scale)
    return _with_noise(spec, options.noise_scale)


def echoed(body: Mapping[str, Any], spec: CheckSpec) -> dict[str, Any]:
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


def _packed(spec: CheckSpec, packing: PackingSpec) -> CheckSpec:
    """The packed check (app/worker/checks/packed_check.py) trains the built-in tokens model on
    its own seeded documents, several steps held in one check."""
    if spec.workload != "tokens":
        raise SpecError("a packed plan is checked on the tokens workload: give workload tokens", "/workload")
    if spec.model != SYNTHETIC:
        raise SpecError(
            "a packed check trains the built-in tokens model on seeded documents of random lengths; "
            "a registered model's dataset is not packed by it: leave model out",
            "/model",
        )
    if spec.steps != 1:
        raise SpecError(
            f"a packed check holds {PACKED_STEPS} seeded steps' gradients, each from the initial "
            "weights; it trains no run: give steps 1",
            "/steps",
        )
    why = collator_refusal() if packing.mode is PackingMode.ROWS else None
    if why is not None:
        raise SpecError(why, "/plan/packing/mode")
    return dataclasses.replace(spec, packing=packing)


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
    request, cap = spec.plan_request, max_micro_batch_size
    micro, accumulation = request.micro_batch_size, request.gradient_accumulation_steps
    if micro is not None and micro > cap:
        micro, accumulation = None, None
    topology = request.topology
    if topology.listed_groups:
        groups = tuple(_capped(g, cap) for g in topology.node_groups)
        topology = dataclasses.replace(topology, node_groups=groups)
    capped = dataclasses.replace(
        request,
        topology=topology,
        micro_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        global_batch_size=spec.global_batch_size,
        max_micro_batch_size=min(request.max_micro_batch_size or cap, cap),
    )
    options = CheckOptions(dtype=spec.dtype, seed=spec.seed, backend=spec.backend, workload=spec.workload)
    fresh = dataclasses.replace(
        build_spec(CheckRequest(capped, options)),
        model=spec.model,
        noise_steps=spec.noise_steps,
        noise_learning_rate=spec.noise_learning_rate,
        fit=spec.fit,
        plan_request=capped,
    )
    for part in REQUEST_PARTS:
        fresh = part.replanned(spec, fresh)
    return fresh


def _capped(group: NodeGroup, cap: int) -> NodeGroup:
    return dataclasses.replace(group, max_micro_batch_size=min(group.max_micro_batch_size or cap, cap))


def _without_nulls(value: Any) -> Any:
    """A deep copy without null fields: a field left null takes its default."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
