"""The planner: a PlanRequest in, a Plan out. Everything here is pure and deterministic."""

from __future__ import annotations

import dataclasses

from app.core.cluster import device_mesh
from app.core.cluster.topology import ReplicaLayout, resolve_layout, validate_topology
from app.core.errors.domain import InvalidValue, PlanError, passes
from app.core.errors.suggestions import with_request_fields
from app.core.explain.plan_explanation import BatchSplit, explain, mesh_sentences
from app.core.explain.run_scale import scale_warnings
from app.core.explain.stream import stream_sentences
from app.core.explain.throughput import throughput_sentences
from app.core.learning_rate.law_report import with_recommendation
from app.core.learning_rate.noise_scale import efficiency, readable
from app.core.learning_rate.recommend import Advice, advise
from app.core.records.plan import (
    BatchEfficiency,
    LearningRatePlan,
    Plan,
    ReplicaGroup,
    SamplerPlan,
    ThroughputPlan,
)
from app.core.records.plan_request import LossNormalization, LossReduction, PlanRequest
from app.core.resume.plan_resume import resumed
from app.core.split.batch import choose_split, solve
from app.core.split.batch_problem import BatchProblem, BatchSolution
from app.core.split.curve_checks import validate_curves
from app.core.split.sampler import even_sampler, proportional_sampler, sampler_warnings
from app.core.split.stream.plan import request_stream
from app.core.split.throughput_plan import Timing, curve_warnings, throughput_plan
from app.core.tokens.token_plan import in_samples, plan_learning_rate_for, token_plan, token_pointed


def _replica_groups(
    request: PlanRequest,
    layout: ReplicaLayout,
    solution: BatchSolution,
    sampler: SamplerPlan | None,
    timing: Timing | None,
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
                predicted_micro_step_s=timing.at(share.segment, share.samples) if timing else None,
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
    except ValueError:  # the one way past the limits (request/limits.py): B / B_noise overflows
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
    """The plan; a batch given in tokens is solved in whole sequences (app.core.tokens.token_plan). A
    request it cannot plan raises a PlanError whose suggestions name request fields and work
    (app.core.errors.suggestions)."""
    try:
        return _planned(request, suggest=True)
    except PlanError as err:
        raise with_request_fields(request, err, _plans) from None


def _planned(request: PlanRequest, *, suggest: bool) -> Plan:
    """The plan, and its resume when the request asks for one (app.core.resume.plan_resume): the resumed
    run's plan is planned here too, and with `suggest`, the nearest data-parallel sizes that
    resume exactly are tried."""
    if request.recommend is not None:
        advice = _advice(request)
        return with_recommendation(_planned(advice.request, suggest=suggest), advice, request)
    planned = _plan_or_raise(request)
    if request.resume is None:
        return planned
    return resumed(request, planned, _plan_or_raise, _quietly if suggest else None)


def _advice(request: PlanRequest) -> Advice:
    """A recommend's law, its batch snapped to this cluster (each candidate planned here) and the
    request with the law's numbers written in (app.core.learning_rate.recommend)."""
    validate_topology(request.topology)
    if request.topology.curves:
        validate_curves(request.topology, request.max_micro_batch_size)
    layout = resolve_layout(request.topology, request.parallelism, request.max_micro_batch_size)
    return advise(request, layout.data_parallel_size, layout.heterogeneous, _quietly)


def law_request(request: PlanRequest) -> PlanRequest:
    """The request as its plan ran: with `recommend`, the law's batch and lr written in and the
    law left out (what exports write, and re-plan on other cluster sizes); else the request."""
    return request if request.recommend is None else _advice(request).request


def _quietly(request: PlanRequest) -> Plan:
    return _planned(request, suggest=False)


def _plan_or_raise(request: PlanRequest) -> Plan:
    if request.gradient_noise_scale_stderr is not None and request.gradient_noise_scale is None:
        # A rule between two fields, which no field's own range states (request/limits.py).
        raise InvalidValue(
            "gradient_noise_scale_stderr is the uncertainty of gradient_noise_scale: give the noise "
            "scale too",
            pointer="/gradient_noise_scale",
        )
    try:
        return _plan(in_samples(request, _plan_or_raise))
    except PlanError as err:
        pointed = token_pointed(request, err)
        if pointed is None:
            raise
        raise pointed from None


def _solved(request: PlanRequest) -> tuple[ReplicaLayout, BatchProblem, BatchSolution]:
    """The cluster's replicas and the batch split over them (micro x accumulation x replicas)."""
    validate_topology(request.topology)
    if request.topology.curves:
        validate_curves(request.topology, request.max_micro_batch_size)
    layout = resolve_layout(request.topology, request.parallelism, request.max_micro_batch_size)
    device_mesh.validate(request.parallelism, layout.data_parallel_size)
    proportional = choose_split(
        layout, request.global_batch_size, request.micro_batch_size, request.divisibility
    )
    problem = BatchProblem(
        layout,
        request.global_batch_size,
        request.micro_batch_size,
        request.gradient_accumulation_steps,
        request.divisibility,
        proportional,
    )
    return layout, problem, solve(problem)


def _sampler(request: PlanRequest, dp: int, common: int | None, G: int, g: int) -> SamplerPlan | None:
    """The epoch as the sampler lays it out: DistributedSampler on an even split, else every
    replica the same micro-steps (the proportional sampler)."""
    if request.dataset is None or request.dataset.kind == "stream":
        return None
    if common is not None:
        return even_sampler(request.dataset, dp, common, g)
    return proportional_sampler(request.dataset, dp, G // g, g)


def _learning_rate(
    request: PlanRequest, G: int, steps_per_epoch: int | None
) -> tuple[LearningRatePlan | None, list[str]]:
    """The recipe, where the request asks for one; a warmup longer than the run is refused
    (app.core.learning_rate.recipe)."""
    if request.learning_rate is None:
        return None, []
    return plan_learning_rate_for(request, G, steps_per_epoch)


def _plan(request: PlanRequest) -> Plan:
    layout, problem, solution = _solved(request)
    G, g, dp = solution.global_batch_size, solution.gradient_accumulation_steps, layout.data_parallel_size
    common = solution.shares[0].samples if solution.even else None
    warnings = list(layout.warnings) + list(solution.warnings)
    throughput, timing = None, None
    if request.topology.curves:
        throughput, timing = throughput_plan(problem, solution)
        warnings += curve_warnings(timing.layout, solution.shares, timing)
    sampler = _sampler(request, dp, common, G, g)
    if sampler is not None:
        assert request.dataset is not None
        warnings += sampler_warnings(sampler, request.dataset, common, g)
    groups = _replica_groups(request, layout, solution, sampler, timing)
    stream = request_stream(request, dp, common if common is not None else groups, g)
    warnings += [w.message for w in stream.warnings] if stream else []
    epoch = stream or sampler  # what feeds the recipe's epochs: the stream's, or the sampler's
    lr_plan, lr_warnings = _learning_rate(request, G, epoch.optimizer_steps_per_epoch if epoch else None)
    batch_efficiency, efficiency_warnings = _efficiency(request, G)
    warnings += lr_warnings + efficiency_warnings + scale_warnings(g, sampler)
    mesh = device_mesh.device_mesh(request.parallelism, dp)
    explanation = explain(
        world=layout.world_size,
        parallelism=request.parallelism,
        split=BatchSplit(dp, G, g, groups, common, stream=stream is not None),
        reduction=request.loss_reduction,
        sampler=sampler,
        lr=lr_plan,
        by_throughput=layout.heterogeneous,
        efficiency=batch_efficiency,
        sequence_length=request.sequence_length,
        wrapper=mesh.wrapper,
    )
    if throughput is not None:
        explanation += _throughput_sentences(request, layout, throughput, G, groups)
    explanation += mesh_sentences(mesh, dp)
    explanation += stream_sentences(stream, dp, layout.model_parallel_size, g) if stream else []
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
        divisibility=request.divisibility.value,
        loss_reduction=request.loss_reduction.value,
        sampler=sampler,
        learning_rate=lr_plan,
        warnings=tuple(warnings),
        explanation=tuple(explanation),
        efficiency=batch_efficiency,
        device_mesh=mesh,
        throughput=throughput,
        stream=stream,
    )
    return _with_tokens(request, planned)


def _throughput_sentences(
    request: PlanRequest,
    layout: ReplicaLayout,
    throughput: ThroughputPlan,
    G: int,
    groups: tuple[ReplicaGroup, ...],
) -> list[str]:
    fixed = request.gradient_accumulation_steps is not None or request.micro_batch_size is not None
    times = layout.step_times  # one StepTime per distinct curve: alike when all are the first
    one_curve = times.count(times[0]) == len(times)
    return throughput_sentences(throughput, G, groups, one_curve, fixed)


def _with_tokens(request: PlanRequest, planned: Plan) -> Plan:
    """The plan with its `tokens` part, where the request counts tokens or asks for a length."""
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
