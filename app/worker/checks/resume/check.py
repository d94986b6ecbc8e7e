"""The resume check: a run of `steps` optimizer steps of the plan's recipe (as run/check.py and
run/mesh.py train it) that stops after `at_step` steps, checkpoints, and goes on from that step
on the resumed plan's replicas: the same plan re-made for `data_parallel_size` replicas with
the same global batch (contract/kinds/resume.py, app.core.resume.plan_resume). The whole trajectory is
held step by step against the uninterrupted single-process reference run (run/referee.py), with
the run-level controls and the resume controls (parts.py).

The ranks beyond the resumed world idle: they take part in what the default group does (the
valid-token count, the losses' sum) with nothing of their own. The checkpoint is the model's
and the optimizer's full state, written once on rank 0 and read by every resumed rank, as a
restarted job loads its file: for DDP the replicated state dicts; for FSDP2 / HSDP / TP meshes
`torch.distributed.checkpoint.state_dict`'s full state (gathered from the old shards, resharded
onto the new mesh by set_*_state_dict). A full state rather than DCP's sharded files: the warm
ranks of a check across hosts share no filesystem, the state is small, and the full state is
what DCP's resharding amounts to for any new mesh. Where each resumed replica starts in its
epoch is the core's `replica_groups[].skip_samples`; the lr is the one schedule's at the step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from app.contract.check_result import CheckResult
from app.contract.kinds.resume import ResumeOutcome
from app.contract.spec import CheckSpec
from app.core.learning_rate.recipe_summary import lr_of
from app.core.records.plan import Plan
from app.core.records.resume import ResumePlan
from app.worker.checks.kind import Context, Laps, Stage
from app.worker.checks.resume.controls import ResumeControls
from app.worker.checks.resume.parts import (
    ResumedReplicas,
    checkpoint_of,
    layout_of,
    resumed_feed,
    summed,
)
from app.worker.checks.resume.ranks import DdpRanks, Feeds, MeshRanks, Ranks
from app.worker.checks.run.check import run_workload
from app.worker.checks.run.referee import Referee
from app.worker.training.replica_feed import ReplicaStep, replica_steps
from app.worker.training.token_model import TokenWorkload
from app.worker.training.workload import Workload


@dataclass
class _Resume:
    """What the resume check builds and records on this rank."""

    plan: Plan
    new: Plan
    resume: ResumePlan
    right: ResumedReplicas  # where the resumed replicas read: the core's skips
    work: Workload
    ranks: Ranks
    referee: Referee | None
    controls: ResumeControls | None
    by_tokens: bool
    order: list[str]
    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)
    valid: list[int | None] = field(default_factory=list)
    result: tuple[Any, ...] = ()


class ResumeRun:
    """A run of the plan's recipe checkpointed after `at_step` steps and resumed on other replicas."""

    name: ClassVar[str] = "resume_run"
    stage: ClassVar[Stage] = "run"
    laps: ClassVar[Laps] = Laps(plan="run", controls=None, reference="run_reference")

    def applies(self, spec: CheckSpec) -> bool:
        return spec.resume_plan is not None

    def prepare(self, ctx: Context) -> _Resume:
        spec = ctx.spec
        plan, new = spec.run_plan, spec.resume_plan
        assert plan is not None and new is not None and plan.resume is not None, "a resume spec's plans"
        work = run_workload(spec, ctx.workload)
        by_tokens = spec.workload == "tokens" and spec.loss_normalization == "token"
        resume = plan.resume
        skips = {r: g.skip_samples for g in resume.replica_groups for r in range(g.start, g.stop)}
        right = layout_of(new, skips.__getitem__)
        leads_a_mesh = ctx.leader and spec.mesh is not None
        order = [n for n, _ in work.module(ctx.dtype, ctx.device).named_parameters()] if leads_a_mesh else []
        ranks = self._ranks(ctx, plan, work, lambda r: replica_steps(plan, r, resume.optimizer_step), order)
        referee = controls = None
        if ctx.leader:
            counts = work.counts if isinstance(work, TokenWorkload) else None
            tokens = (lambda ix: counts(ix, ctx.device)[0]) if by_tokens and counts else None
            referee = Referee(
                plan, spec.steps, work, dtype_name=spec.dtype, device=ctx.device, valid_tokens=tokens
            )
            controls = ResumeControls(plan, new, right, resume.epoch, resume.optimizer_step, spec.steps)
            ctx.timer.set_aside("run_reference", referee.seconds)
        return _Resume(plan, new, resume, right, work, ranks, referee, controls, by_tokens, order)

    def _ranks(self, ctx: Context, plan: Plan, work: Workload, feeds: Feeds, order: list[str]) -> Ranks:
        if ctx.spec.mesh is not None:
            return MeshRanks(ctx, plan, work, feeds, order)
        processes = min(ctx.group.world, plan.data_parallel_size)
        return DdpRanks(ctx, plan, work, processes, feeds)

    def _resumed(self, ctx: Context, state: _Resume) -> Ranks:
        """The checkpoint on the old ranks, loaded by the new ones."""
        saved = state.ranks.checkpoint(ctx)
        epoch = state.resume.epoch

        def feeds(r: int) -> Iterator[ReplicaStep]:
            return resumed_feed(state.new, state.right, r, epoch)

        ranks = self._ranks(ctx, state.new, state.work, feeds, state.order)
        if ranks.member:
            ranks.load(checkpoint_of(saved, ranks.group))
        return ranks

    def plan(self, ctx: Context, state: _Resume) -> None:
        recipe = state.plan.learning_rate
        assert recipe is not None
        for k in range(ctx.spec.steps):
            if k == state.resume.optimizer_step:
                state.ranks = self._resumed(ctx, state)
            ranks = state.ranks
            epoch, loss, valid = ranks.step(ctx, state.by_tokens)
            state.epochs.append(epoch)
            state.losses.append(loss)
            state.valid.append(valid)
            rate = lr_of(recipe, k)
            state.lrs.append(rate)
            if ranks.member:
                if recipe.max_grad_norm is not None:
                    ranks.clip(recipe.max_grad_norm)
                for param_group in ranks.optimizer.param_groups:
                    param_group["lr"] = rate
                ranks.optimizer.step()
            self._judge(ctx, state, k, ranks.whole(ctx))
        state.losses = summed(state.losses, ctx.device)

    def _judge(self, ctx: Context, state: _Resume, k: int, params: torch.Tensor | None) -> None:
        """Rank 0: the reference's step k beside the run's, and the controls' from the checkpoint."""
        referee, controls = state.referee, state.controls
        if referee is None or controls is None or params is None:
            return
        spent = referee.seconds
        referee.step(params)
        reference = referee.reference.trainer
        if k + 1 == state.resume.optimizer_step:
            controls.fork(reference, referee.tolerance)
        elif k >= state.resume.optimizer_step:
            controls.step(k, reference.flat_params())
        ctx.timer.set_aside("run_reference", referee.seconds - spent)

    def controls(self, ctx: Context, state: _Resume) -> None:
        """The run-level and resume controls train beside the reference run on rank 0."""

    def measure(self, ctx: Context, state: _Resume) -> bool:
        return False

    def reference(self, ctx: Context, state: _Resume) -> None:
        assert state.referee is not None and state.controls is not None
        run, outcomes, skipped = state.referee.outcome(state.losses, state.lrs, state.epochs, state.valid)
        mine, ran, not_run = state.controls.outcome()
        run = dataclasses.replace(run, controls={**run.controls, **ran})
        state.result = (run, outcomes + tuple(mine), skipped + tuple(not_run))

    def result(self, ctx: Context, state: _Resume, prior: CheckResult | None) -> CheckResult:
        assert prior is not None and state.result
        run, outcomes, skipped = state.result
        resume, at = state.resume, state.resume.optimizer_step
        part = ResumeOutcome(
            at_step=at,
            epoch=resume.epoch,
            step_in_epoch=resume.step_in_epoch,
            data_parallel_size_before=state.plan.data_parallel_size,
            data_parallel_size_after=state.new.data_parallel_size,
            micro_batch_size=resume.micro_batch_size,
            gradient_accumulation_steps=resume.gradient_accumulation_steps,
            replica_groups=resume.replica_groups,
            checkpoint=_CHECKPOINT["mesh" if ctx.spec.mesh else "ddp"],
            matches=all(s.within_tolerance for s in run.trajectory[at:]),
        )
        return dataclasses.replace(prior.with_run(ctx.spec.steps, run, outcomes, skipped), resume=part)


_CHECKPOINT = {
    "ddp": "rank 0's model and optimizer state_dict (torch.save), loaded by every resumed rank",
    "mesh": "the full model and optimizer state (torch.distributed.checkpoint.state_dict, full_state_dict) "
    "gathered from the old mesh on rank 0, loaded by every resumed rank onto its new shards",
}
