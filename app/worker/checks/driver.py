"""The one driver of every check: the warm ranks (rank_server) and the rank program under
torchrun (gradcheck) call `run_spec`, which runs the spec's kinds stage by stage (kind.STAGES:
its step kind, its run kind if any, then each `after` kind that applies; registry.py), on an
initialised default process group."""

from __future__ import annotations

import dataclasses
from typing import Any

from app.contract.check_result import CheckResult
from app.contract.spec import CheckSpec
from app.worker.checks.kind import STAGES, CheckKind, Context
from app.worker.checks.registry import KINDS
from app.worker.checks.result_parts import CheckGroup
from app.worker.training.workload import Workload


def kinds_for(spec: CheckSpec) -> list[CheckKind[Any]]:
    """Stage by stage, the kinds that apply in registry order: the first alone where the stage
    says so (a spec always has a step kind: the last applies to every spec)."""
    chosen: list[CheckKind[Any]] = []
    for stage, first_only in STAGES:
        applying = [k for k in KINDS if k.stage == stage and k.applies(spec)]
        chosen += applying[:1] if first_only else applying
    return chosen


def drive(kind: CheckKind[Any], ctx: Context, prior: CheckResult | None) -> CheckResult | None:
    """One kind's phases, each lapped; rank 0 returns its result, every other rank None."""
    laps, timer = kind.laps, ctx.timer
    state = kind.prepare(ctx)
    kind.plan(ctx, state)
    timer.lap(laps.plan)
    kind.controls(ctx, state)
    if laps.controls:
        timer.lap(laps.controls)
    if kind.measure(ctx, state) and laps.measure:
        timer.lap(laps.measure)
    if not ctx.leader:
        return None
    kind.reference(ctx, state)
    if laps.reference:
        timer.lap(laps.reference)
    return kind.result(ctx, state, prior)


def run_spec(
    spec: CheckSpec, group: CheckGroup, workload: Workload, model_target: str | None
) -> CheckResult | None:
    """Run the check on an initialised default process group; rank 0 returns the result."""
    ctx = Context(spec, group, workload, model_target)
    result: CheckResult | None = None
    for kind in kinds_for(spec):
        result = drive(kind, ctx, result)
    if result is None:
        return None
    return dataclasses.replace(result, timings=ctx.timer.timings())
