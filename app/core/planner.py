"""The planner: a PlanRequest in, a Plan out. Everything here is pure and deterministic."""

from __future__ import annotations

import dataclasses
import math

from app.core import device_mesh
from app.core.batch import BatchProblem, BatchSolution, choose_split, solve
from app.core.errors import InvalidValue, PlanError, field_key, passes
from app.core.explain import explain, mesh_sentences
from app.core.field_suggestions import with_request_fields
from app.core.noise_scale import efficiency, readable
from app.core.plan_types import (
    MAX_SAFE_INTEGER,
    BatchEfficiency,
    LossNormalization,
    LossReduction,
    Plan,
    PlanRequest,
    ReplicaGroup,
    SamplerPlan,
)
from app.core.resume import resumed
from app.core.run_scale import scale_warnings
from app.core.sampler import even_sampler, proportional_sampler, sampler_warnings
from app.core.tokens import in_samples, plan_learning_rate_for, token_plan, token_pointed
from app.core.topology import Layout, resolve_layout, validate_topology


def _check_counts(request: PlanRequest) -> None:
    """The ranges of CONTRACT.md "Limits"; the HTTP schema enforces them too, earlier."""
    counts: list[tuple[str, int | None, int]] = [
        ("/global_batch_size", request.global_batch_size, 1),
        ("/micro_batch_size", request.micro_batch_size, 1),
        ("/gradient_accumulation_steps", request.gradient_accumulation_steps, 1),
        ("/max_micro_batch_size", request.max_micro_batch_size, 1),
        ("/parallelism/tensor", request.parallelism.tensor, 1),
        ("/parallelism/pipeline", request.parallelism.pipeline, 1),
        ("/parallelism/context", request.parallelism.context, 1),
        ("/parallelism/data_parallel_shard", request.parallelism.data_parallel_shard, 1),
        ("/parallelism/expert", request.parallelism.expert, 1),
    ]
    if request.dataset is not None:
        counts += [
            ("/dataset/num_samples", request.dataset.num_samples, 1),
            ("/dataset/seed", request.dataset.seed, 0),
            ("/dataset/epochs", request.dataset.epochs, 1),
        ]
    lr = request.learning_rate
    if lr is not None:
        counts += [
            ("/learning_rate/base_batch_size", lr.base_batch_size, 1),
            ("/learning_rate/warmup_steps", lr.warmup_steps, 0),
            ("/learning_rate/train_steps", lr.train_steps, 1),
            ("/learning_rate/train_samples", lr.train_samples, 1),
        ]
        for pointer, value in (("/learning_rate/base_lr", lr.base_lr), ("/learning_rate/eps", lr.eps)):
            if not (math.isfinite(value) and value > 0):
                raise InvalidValue(f"{pointer.rsplit('/', 1)[1]} must be finite and > 0", pointer=pointer)
        epochs = lr.warmup_epochs
        if epochs is not None and not (math.isfinite(epochs) and epochs >= 0):
            raise InvalidValue(
                "warmup_epochs must be finite and >= 0", pointer="/learning_rate/warmup_epochs"
            )
        for beta in lr.betas:
            if not 0 <= beta < 1:
                raise InvalidValue("betas must lie in [0, 1)", pointer="/learning_rate/betas")
    noise, stderr = request.gradient_noise_scale, request.gradient_noise_scale_stderr
    if noise is not None and not (math.isfinite(noise) and noise > 0):
        raise InvalidValue("gradient_noise_scale must be finite and > 0", pointer="/gradient_noise_scale")
    if stderr is not None:
        if noise is None:
            raise InvalidValue(
                "gradient_noise_scale_stderr is the uncertainty of gradient_noise_scale: give "
                "the noise scale too",
                pointer="/gradient_noise_scale",
            )
        if not (math.isfinite(stderr) and stderr >= 0):
            raise InvalidValue(
                "gradient_noise_scale_stderr must be finite and >= 0",
                pointer="/gradient_noise_scale_stderr",
            )
    for pointer, number, low in counts:
        # A plain int in range, the usual case, is one type test and one comparison.
        if number is None or (type(number) is int and low <= number <= MAX_SAFE_INTEGER):
            continue
        if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= MAX_SAFE_INTEGER:
            name = pointer.rsplit("/", 1)[1]
            nearest_ok = min(max(number, low), MAX_SAFE_INTEGER) if isinstance(number, int) else low
            raise InvalidValue(
                f"{name} must be a whole number from {low} to {MAX_SAFE_INTEGER}",
                pointer=pointer,
                suggestions={field_key(pointer): [nearest_ok]},
            )


def _replica_groups(
    request: PlanRequest, layout: Layout, solution: BatchSolution, sampler: SamplerPlan | None
) -> tuple[ReplicaGroup, ...]:
    dp, G, g = layout.data_parallel_size, solution.global_batch_size, solution.gradient_accumulation_steps
    groups = []
    for share in solution.shares:
        segment = layout.segments[share.segment]
        # Float division of exact integers: one correctly rounded value, as a user's
        # own `dp * micro / global` would give.
        scale: float | None = (
            dp * share.samples / G if request.loss_reduction is LossReduction.MEAN else dp / G
        )
        if request.loss_normalization is LossNormalization.TOKEN:
            scale = None  # it depends on the step's valid tokens: TokenPlan.loss_scale_formula
        if sampler is None:
            per_replica = None
        elif sampler.num_samples_per_replica is not None:
            per_replica = sampler.num_samples_per_replica
        else:
            per_replica = sampler.micro_steps_per_epoch * share.samples
        groups.append(
            ReplicaGroup(
                start=share.start,
                stop=share.stop,
                node_group=segment.node_group,
                micro_batch_size=share.samples,
                samples_per_step=share.samples * g,
                loss_scale=scale,
                relative_throughput=segment.throughput,
                max_micro_batch_size=segment.cap,
                num_samples_per_replica=per_replica,
            )
        )
    return tuple(groups)


def _efficiency(request: PlanRequest, global_batch: int) -> tuple[BatchEfficiency | None, list[str]]:
    """The global batch that runs against the request's measured noise scale, and a
    warning when it is far from the critical batch."""
    noise, stderr = request.gradient_noise_scale, request.gradient_noise_scale_stderr
    if noise is None:
        return None, []
    try:
        e = efficiency(global_batch, noise, stderr)
    except ValueError:  # the one way past _check_counts: B / B_noise overflows
        raise InvalidValue(
            f"gradient_noise_scale {noise:g} is too small for global batch {global_batch}: "
            f"their ratio overflows",
            pointer="/gradient_noise_scale",
        ) from None
    head = (
        f"global batch {global_batch} is {readable(e.batch_to_critical)}x the critical batch "
        f"(gradient noise scale {readable(e.gradient_noise_scale)})"
    )
    if e.verdict == "above_critical":
        return e, [
            f"{head}: it needs {readable(e.samples_vs_min)}x the fewest possible samples "
            f"({readable(e.sample_efficiency * 100)}% sample efficiency); a global batch near "
            f"{readable(e.critical_batch_size)} would use the data better"
        ]
    if e.verdict == "below_critical":
        return e, [
            f"{head}: it needs {readable(e.steps_vs_min)}x the fewest possible optimizer steps "
            f"({readable(e.step_efficiency * 100)}% step efficiency); a bigger global batch, up "
            f"to about {readable(e.critical_batch_size)}, would cut them nearly in proportion"
        ]
    return e, []


def plan(request: PlanRequest) -> Plan:
    """The plan; a batch given in tokens is solved in whole sequences (app.core.tokens). A
    request it cannot plan raises a PlanError whose suggestions name request fields and work
    (app.core.field_suggestions)."""
    try:
        return _planned(request, suggest=True)
    except PlanError as err:
        raise with_request_fields(request, err, _plans) from None


def _planned(request: PlanRequest, *, suggest: bool) -> Plan:
    """The plan, and its resume when the request asks for one (app.core.resume): the resumed
    run's plan is planned here too, and with `suggest`, the nearest data-parallel sizes that
    resume exactly are tried."""
    planned = _plan_or_raise(request)
    if request.resume is None:
        return planned
    return resumed(request, planned, _plan_or_raise, _quietly if suggest else None)


def _quietly(request: PlanRequest) -> Plan:
    return _planned(request, suggest=False)


def _plan_or_raise(request: PlanRequest) -> Plan:
    try:
        return _plan(in_samples(request, _plan_or_raise))
    except PlanError as err:
        pointed = token_pointed(request, err)
        if pointed is None:
            raise
        raise pointed from None


def _plan(request: PlanRequest) -> Plan:
    validate_topology(request.topology)
    _check_counts(request)
    layout = resolve_layout(request.topology, request.parallelism, request.max_micro_batch_size)
    device_mesh.validate(request.parallelism, layout.data_parallel_size)
    proportional = choose_split(
        layout, request.global_batch_size, request.micro_batch_size, request.divisibility
    )
    solution = solve(
        BatchProblem(
            layout,
            request.global_batch_size,
            request.micro_batch_size,
            request.gradient_accumulation_steps,
            request.divisibility,
            proportional,
        )
    )
    G, g, dp = solution.global_batch_size, solution.gradient_accumulation_steps, layout.data_parallel_size
    common = solution.shares[0].samples if solution.even else None

    warnings = list(layout.warnings) + list(solution.warnings)
    sampler = None
    if request.dataset is not None:
        if common is not None:
            sampler = even_sampler(request.dataset, dp, common, g)
        else:
            sampler = proportional_sampler(request.dataset, dp, G // g, g)
        warnings += sampler_warnings(sampler, request.dataset, common, g)

    lr_plan = None
    if request.learning_rate is not None:
        lr_plan, lr_warnings = plan_learning_rate_for(
            request, G, sampler.optimizer_steps_per_epoch if sampler else None
        )
        warnings += lr_warnings  # a warmup longer than the run is refused (app.core.recipe)
    batch_efficiency, efficiency_warnings = _efficiency(request, G)
    warnings += efficiency_warnings
    warnings += scale_warnings(g, sampler)
    groups = _replica_groups(request, layout, solution, sampler)
    explanation = explain(
        world=layout.world_size,
        parallelism=request.parallelism,
        dp=dp,
        global_batch=G,
        accumulation=g,
        groups=groups,
        common_micro=common,
        reduction=request.loss_reduction,
        sampler=sampler,
        lr=lr_plan,
        by_throughput=layout.heterogeneous,
        efficiency=batch_efficiency,
        sequence_length=request.sequence_length,
    )
    mesh = device_mesh.device_mesh(request.parallelism, dp)
    explanation += mesh_sentences(mesh, dp)
    planned = Plan(
        world_size=layout.world_size,
        model_parallel_size=layout.model_parallel_size,
        data_parallel_size=dp,
        requested_global_batch_size=request.global_batch_size,
        global_batch_size=G,
        micro_batch_size=common,
        gradient_accumulation_steps=g,
        replica_groups=groups,
        split="even" if common is not None else "proportional",
        divisibility=str(request.divisibility),
        loss_reduction=str(request.loss_reduction),
        sampler=sampler,
        learning_rate=lr_plan,
        warnings=tuple(warnings),
        explanation=tuple(explanation),
        efficiency=batch_efficiency,
        device_mesh=mesh,
    )
    tokens, token_warnings, token_lines = token_plan(request, planned)
    if tokens is None:
        return planned
    return dataclasses.replace(
        planned,
        tokens=tokens,
        warnings=planned.warnings + tuple(token_warnings),
        explanation=planned.explanation + tuple(token_lines),
    )


_plans = passes(_quietly, PlanError)  # whether a request plans: how a suggestion is tried
