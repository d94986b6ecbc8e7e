"""A plan's resume: where a checkpointed run goes on, perhaps on another data-parallel size,
and whether it then sees the global batches the uninterrupted run would have seen.

The run resumes at optimizer step t (the steps taken before the checkpoint; consumed samples
t x B without a ramp-up). The uninterrupted run was then in epoch t // S at step t % S of it,
S its whole optimizer steps per epoch. On W' replicas that keep the global batch B, each rank
calls `set_epoch(epoch)` and skips its first (t % S) x g' micro-batches of the epoch, g' the
accumulation at W': those are (t % S) x B / W' indices of its shard, the blocks of the steps
already taken (app.core.resume.layout). The lr is the one schedule's at step t.

A proportional (mixed-cluster) plan resumes exactly on its own cluster; on another replica
count the shares depend on throughputs a count does not give, and it is refused. Ramp-up runs
resume by consumed samples (app.core.resume.ramp, through POST /v1/plans/schedule).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from app.core.errors.domain import InvalidValue, PlanError, passes
from app.core.errors.suggestions import nearest_working
from app.core.learning_rate.recipe_summary import lr_of
from app.core.records.integers import divisors
from app.core.records.plan import Plan
from app.core.records.plan_request import MAX_WORLD_SIZE, PlanRequest, Topology
from app.core.records.resume import EpochTail, ResumeGroup, ResumePlan, ResumeSpec
from app.core.resume.layout import describe, epoch_tail, tail_difference
from app.core.resume.stream_resume import stream_resumed
from app.core.resume.text import resume_sentence, resume_warnings

Replan = Callable[[PlanRequest], Plan]
TRIES = 32  # requests tried for a suggested data-parallel size
_DP = "/resume/data_parallel_size"


def run_length(plan: Plan) -> int | None:
    """The run's optimizer steps: the recipe's, else the dataset's epochs'; None when unknown."""
    if plan.learning_rate is not None and plan.learning_rate.train_steps is not None:
        return plan.learning_rate.train_steps
    return plan.sampler.total_optimizer_steps if plan.sampler else None


def _step(spec: ResumeSpec, plan: Plan) -> int:
    given = [name for name in ("optimizer_step", "consumed_samples") if getattr(spec, name) is not None]
    if len(given) != 1:
        raise InvalidValue(
            "resume takes optimizer_step (steps taken before the checkpoint) or consumed_samples"
            + (", not both" if given else ": give one of them"),
            pointer="/resume/consumed_samples" if given else "/resume",
        )
    batch = plan.global_batch_size
    if spec.optimizer_step is not None:
        if spec.optimizer_step < 0:
            raise InvalidValue("resume.optimizer_step must be >= 0", pointer="/resume/optimizer_step")
        return spec.optimizer_step
    consumed = spec.consumed_samples
    assert consumed is not None
    if consumed < 0 or consumed % batch:
        low = max(consumed // batch, 0) * batch
        raise InvalidValue(
            f"resume.consumed_samples {consumed} is not a whole number of optimizer steps of the global "
            f"batch {batch}: a checkpoint is taken between steps (with a ramp-up, resume through "
            f"POST /v1/plans/schedule)",
            pointer="/resume/consumed_samples",
            suggestions={"resume.consumed_samples": [low, low + batch]},
        )
    return consumed // batch


def _check_position(plan: Plan, step: int, spec: ResumeSpec) -> EpochTail:
    if plan.sampler is None:
        raise InvalidValue(
            "a resume needs the plan's dataset (dataset.num_samples): where a step lies in its epoch "
            "depends on it",
            pointer="/resume",
        )
    tail = epoch_tail(plan)
    if tail.optimizer_steps == 0:
        raise InvalidValue(
            "the plan's epoch holds no whole optimizer step: there is no position to resume at",
            pointer="/resume",
        )
    total = run_length(plan)
    if total is not None and step >= total:
        by_samples = spec.consumed_samples is not None
        field = "consumed_samples" if by_samples else "optimizer_step"
        last = (total - 1) * (plan.global_batch_size if by_samples else 1)
        raise InvalidValue(
            f"resume at optimizer step {step} is past the run's end: the run has {total} optimizer "
            f"steps (0 to {total - 1}), so step {total - 1} is the last one to resume at",
            pointer=f"/resume/{field}",
            suggestions={f"resume.{field}": [last]},
        )
    return tail


def _micro_batch(request: PlanRequest, plan: Plan, share: int) -> int:
    """The largest micro-batch that divides a replica's share and fits: within the request's cap
    (and its node groups'), else within the plan's own micro-batch, which is known to fit."""
    caps = [g.max_micro_batch_size for g in request.topology.node_groups if g.max_micro_batch_size]
    if request.max_micro_batch_size is not None:
        caps.append(request.max_micro_batch_size)
    cap = min(caps) if caps else min(g.micro_batch_size for g in plan.replica_groups)
    return max(d for d in divisors(share) if d <= max(cap, 1))


def _shard(plan: Plan, replicas: int) -> int:
    """FSDP stays FSDP, DDP stays DDP; HSDP keeps its shard group where it divides the replicas."""
    mesh = plan.device_mesh
    if mesh is None or mesh.wrapper == "ddp":
        return 1
    if mesh.wrapper == "hsdp" and replicas % mesh.data_parallel_shard == 0:
        return mesh.data_parallel_shard
    return replicas


def _topology(request: PlanRequest, gpus: int) -> Topology:
    per_node = request.topology.node_groups[0].gpus_per_node
    if not request.topology.listed_groups and gpus % per_node == 0:
        return Topology.homogeneous(gpus // per_node, per_node)
    return Topology.homogeneous(1, gpus)


def resumed_plan(request: PlanRequest, plan: Plan, replicas: int, replan: Replan) -> Plan:
    """The plan the resumed run trains: the same global batch on `replicas` replicas."""
    if replicas == plan.data_parallel_size:
        return plan
    high = MAX_WORLD_SIZE // plan.model_parallel_size
    if not 1 <= replicas <= high:
        raise InvalidValue(f"resume.data_parallel_size must be from 1 to {high}", pointer=_DP)
    if plan.split != "even":
        raise InvalidValue(
            f"this plan splits each step by throughput over a mixed cluster (the proportional sampler): "
            f"on {replicas} replicas the shares depend on throughputs a replica count does not give, so "
            f"the position cannot be carried over exactly. Resume on the plan's "
            f"{plan.data_parallel_size} replicas, or plan the new cluster with the same global batch "
            f"and resume that plan",
            pointer=_DP,
            suggestions={"resume.data_parallel_size": [plan.data_parallel_size]},
        )
    batch = plan.global_batch_size
    if batch % replicas:
        raise InvalidValue(
            f"the global batch {batch} does not split over {replicas} replicas: a resume keeps the "
            f"global batch, so the data-parallel size must divide it",
            pointer=_DP,
        )
    micro = _micro_batch(request, plan, batch // replicas)
    changed = dataclasses.replace(
        request,
        topology=_topology(request, replicas * plan.model_parallel_size),
        parallelism=dataclasses.replace(request.parallelism, data_parallel_shard=_shard(plan, replicas)),
        global_batch_size=batch,
        micro_batch_size=micro,
        gradient_accumulation_steps=None,
        max_micro_batch_size=None,
        global_batch_tokens=None,
        micro_batch_tokens=None,
        learning_rate=None,  # the resumed run keeps the uninterrupted run's schedule
        gradient_noise_scale=None,
        gradient_noise_scale_stderr=None,
        resume=None,
    )
    try:
        return replan(changed)
    except PlanError as err:
        raise InvalidValue(f"on {replicas} data-parallel replicas: {err.detail}", pointer=_DP) from None


def _nearest_sizes(request: PlanRequest, plan: Plan, works: Callable[[PlanRequest], bool]) -> list[int]:
    if request.resume is None or request.resume.data_parallel_size is None:
        spec = dataclasses.replace(request.resume or ResumeSpec(), data_parallel_size=plan.data_parallel_size)
        request = dataclasses.replace(request, resume=spec)
    high = MAX_WORLD_SIZE // plan.model_parallel_size
    return nearest_working(request, "resume.data_parallel_size", high, works, TRIES)


def _exact(whole: Replan) -> Callable[[PlanRequest], bool]:
    """Whether a request plans and its resume sees the uninterrupted run's global batches."""

    def exact(request: PlanRequest) -> bool:
        try:
            resume = whole(request).resume
        except PlanError:
            return False
        return resume is not None and resume.same_global_batches

    return exact


# Over 60 lines: the resumed run's plan, its position and its verdict are read off one another;
# the arithmetic itself lives in resume_layout.py.
def resumed(request: PlanRequest, plan: Plan, replan: Replan, whole: Replan | None) -> Plan:
    """`plan` with its `resume`. `replan` plans a request without resume; `whole` plans one
    with it (its suggestions left out), to find the nearest data-parallel sizes that resume
    exactly; None leaves them out."""
    spec = request.resume
    assert spec is not None
    if plan.stream is not None:  # its readers' positions are not the sampler's blocks of an epoch
        return stream_resumed(request, plan)
    step = _step(spec, plan)
    tail = _check_position(plan, step, spec)
    replicas = spec.data_parallel_size or plan.data_parallel_size
    try:
        new = resumed_plan(request, plan, replicas, replan)
    except InvalidValue as err:
        if err.pointer == _DP and whole is not None and not err.suggestions:
            found = _nearest_sizes(request, plan, passes(whole, PlanError))
            err.suggestions = {"resume.data_parallel_size": found} if found else {}
        raise
    epoch, in_epoch = divmod(step, tail.optimizer_steps)
    total = run_length(plan)
    last_epoch, last_step = divmod(total - 1, tail.optimizer_steps) if total is not None else (None, 0)
    new_tail = epoch_tail(new)
    ends_here = last_epoch is not None and last_epoch == epoch
    last = last_step if ends_here else None
    differs = tail_difference(tail, new_tail, plan.global_batch_size, in_epoch, last)
    why, suggestions = None, dict[str, list[int]]()
    if differs is not None:
        at, later = differs
        why = (
            f"the epoch's end depends on the replicas: {describe(new_tail, replicas)}, where "
            f"{describe(tail, plan.data_parallel_size)}; step {at} of {'a later' if later else 'this'} "
            f"epoch reads other samples than the uninterrupted run's"
        )
        if whole is not None:
            found = _nearest_sizes(request, plan, _exact(whole))
            suggestions = {"resume.data_parallel_size": found} if found else {}
    g = new.gradient_accumulation_steps
    groups = tuple(
        ResumeGroup(r.start, r.stop, r.micro_batch_size, in_epoch * g, in_epoch * g * r.micro_batch_size)
        for r in new.replica_groups
    )
    resume = ResumePlan(
        optimizer_step=step,
        consumed_samples=step * plan.global_batch_size,
        epoch=epoch,
        step_in_epoch=in_epoch,
        data_parallel_size=replicas,
        micro_batch_size=new.micro_batch_size,
        gradient_accumulation_steps=g,
        skip_micro_batches=in_epoch * g,
        replica_groups=groups,
        lr=lr_of(plan.learning_rate, step) if plan.learning_rate is not None else None,
        remaining_steps=total - step if total is not None else None,
        optimizer_steps_per_epoch=new_tail.optimizer_steps,
        optimizer_steps_per_epoch_before=tail.optimizer_steps,
        optimizer_steps_per_epoch_after=new_tail.optimizer_steps,
        same_global_batches=differs is None,
        why=why,
        suggestions=suggestions,
    )
    return dataclasses.replace(
        plan,
        resume=resume,
        warnings=plan.warnings + tuple(resume_warnings(plan, resume, tail, new_tail, ends_here)),
        explanation=(*plan.explanation, resume_sentence(resume)),
    )
