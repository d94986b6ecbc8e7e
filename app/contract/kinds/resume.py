"""A resume check (`resume` beside `steps`), the contract half: the run trains `at_step`
optimizer steps on the plan's replicas, checkpoints, and goes on on `data_parallel_size`
replicas with the plan re-made for them (the core's resume, app.core.resume.plan_resume). What
cannot be checked so is refused here, each a 422 at the check request's field with values that
work; `ResumeOutcome` is what the result says of it. Pure (standard library and the core): the
web process builds it, every rank reads the plans it gives.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from app.contract.kinds.part import RequestPart, Trained
from app.contract.kinds.run import planned_run, weighed_on_samples
from app.contract.mesh_spec import mesh_sizes
from app.core.errors.domain import InvalidValue, PlanError
from app.core.planner import plan
from app.core.records.plan import Plan
from app.core.records.plan_request import PlanRequest
from app.core.records.resume import ResumeGroup, ResumeSpec
from app.core.resume.plan_resume import resumed_plan

if TYPE_CHECKING:
    from app.contract.request import CheckRequest
    from app.contract.spec import CheckSpec

AT = "/resume/at_step"
DP = "/resume/data_parallel_size"
_SUGGESTED = 3  # data-parallel sizes named in a refusal


@dataclass(frozen=True, slots=True)
class ResumeOptions:
    """A run (`steps` above 1) checkpointed after `at_step` optimizer steps on the plan's
    replicas and resumed on `data_parallel_size` replicas: the same plan re-made for that many
    replicas with the same global batch (app.core.resume.plan_resume)."""

    at_step: int
    data_parallel_size: int


@dataclass(frozen=True, slots=True)
class ResumeOutcome:
    """A resume check's resume: where the run was checkpointed, the replicas it went on with
    (the plan re-made for them, the same global batch), where each of their groups resumed in
    the epoch, and whether the run from the checkpoint on matched the uninterrupted reference."""

    at_step: int  # optimizer steps taken before the checkpoint: the first step after it
    epoch: int  # the epoch at_step lies in, and its step in it
    step_in_epoch: int
    data_parallel_size_before: int
    data_parallel_size_after: int
    micro_batch_size: int | None  # after the resume (None: its replica groups differ)
    gradient_accumulation_steps: int  # after the resume
    replica_groups: tuple[ResumeGroup, ...]  # each group's skip from its epoch's start, after set_epoch
    checkpoint: str  # what the checkpoint held and how the resumed ranks loaded it
    matches: bool  # every step from at_step on within the run's tolerance


class ResumePart(RequestPart):
    """`resume`: the run (RunPart's) resumed; every rank runs the run's plan with its resume
    (`CheckSpec.run_plan`) and, from the checkpoint on, the plan re-made for fewer replicas
    (`CheckSpec.resume_plan`)."""

    option: ClassVar[str] = "resume"

    def trains(self, request: CheckRequest, trained: Trained) -> Trained:
        # Refused before the spec of the first step is built, as a run is; `apply` builds it.
        asked = request.options.resume
        if asked is not None:
            resume_run(trained.request, trained.plan, request.options.steps, asked)
        return trained

    def apply(self, request: CheckRequest, trained: Trained, spec: CheckSpec) -> CheckSpec:
        asked = request.options.resume
        if asked is None:
            return spec
        run, resumed = resume_run(trained.request, trained.plan, request.options.steps, asked)
        on_samples = spec.workload != "tokens"
        return dataclasses.replace(
            spec,
            run_plan=planned_run(run, on_samples=on_samples),
            resume_plan=weighed_on_samples(resumed, on_samples),
        )


def resume_run(
    trained: PlanRequest, planned: Plan, steps: int, resume: ResumeOptions
) -> tuple[PlanRequest, Plan]:
    """The run's plan request with its `resume` (its plan carries the core's skips), and the
    plan the run goes on with on `resume.data_parallel_size` replicas."""
    if steps < 2:
        raise InvalidValue(
            "a resume check resumes a run: give steps above 1 (the run's length), with resume.at_step "
            "between 1 and steps - 1",
            pointer="/steps",
            suggestions={"steps": [max(resume.at_step + 1, 2)]},
        )
    if not 1 <= resume.at_step < steps:
        raise InvalidValue(
            f"resume.at_step {resume.at_step} is not inside the run of {steps} optimizer steps: the "
            f"checkpoint is taken after 1 to {steps - 1} steps, so that the run goes on after it",
            pointer=AT,
            suggestions={"resume.at_step": [min(max(resume.at_step, 1), steps - 1)]},
        )
    _refuse_what_the_check_cannot_run(planned)
    before, after = planned.data_parallel_size, resume.data_parallel_size
    if after > before:
        raise InvalidValue(
            f"resume.data_parallel_size {after} is more than the plan's {before} replicas: the check "
            f"resumes on the ranks that trained the plan, so it runs on at most {before}",
            pointer=DP,
            suggestions={"resume.data_parallel_size": _working(trained, resume.at_step, before)},
        )
    asked = dataclasses.replace(
        trained, resume=ResumeSpec(optimizer_step=resume.at_step, data_parallel_size=after)
    )
    whole = _resumed(asked, trained, before)
    assert whole.resume is not None
    if not whole.resume.same_global_batches:
        sizes = _working(trained, resume.at_step, before)
        raise InvalidValue(
            f"on {after} replicas the resumed run does not see the uninterrupted run's global batches, "
            f"so no resume can match it: {whole.resume.why}",
            pointer=DP,
            suggestions={
                **({"resume.data_parallel_size": sizes} if sizes else {}),
                **_dataset_fixes(trained, resume.at_step, after, steps, planned.global_batch_size),
            },
        )
    return asked, resumed_plan(trained, planned, after, plan)


def _refuse_what_the_check_cannot_run(planned: Plan) -> None:
    if planned.split != "even":
        raise InvalidValue(
            "a resume check runs an even split (DistributedSampler): a mixed cluster's plan resumes "
            "only on its own replicas, which needs no check of another world size",
            pointer="/resume",
        )
    sizes = mesh_sizes(planned)
    if sizes is not None and sizes["pp"] > 1:
        raise InvalidValue(
            "a resume check runs data-parallel and tensor-parallel meshes; pipeline stages resume as "
            "their data-parallel replicas do: check the plan with pipeline 1",
            pointer="/resume",
        )


def _resumed(request: PlanRequest, trained: PlanRequest, most: int) -> Plan:
    """The plan with its resume; the core's errors at the check request's resume fields, with
    the sizes the check can run (at most the plan's replicas)."""
    try:
        return plan(request)
    except PlanError as err:
        if not err.pointer.startswith("/resume"):
            raise err.under("/plan") from None
        if err.pointer != DP:
            raise dataclasses.replace(err, pointer="/resume", suggestions={}) from None
        assert request.resume is not None
        found = _working(trained, request.resume.optimizer_step or 0, most)
        raise dataclasses.replace(
            err, suggestions={"resume.data_parallel_size": found} if found else {}
        ) from None


def _dataset_fixes(
    trained: PlanRequest, at_step: int, after: int, steps: int, batch: int
) -> dict[str, list[int]]:
    """The plan's own fixes of an epoch whose end depends on the replicas, each planned with the
    resume on `after` replicas and kept only where it is then exact: the nearest dataset sizes
    either side whose epoch ends alike on both (a dataset that fills the epoch's last step)."""
    dataset = trained.dataset
    if dataset is None:
        return {}

    def exact(changed: PlanRequest) -> bool:
        asked = dataclasses.replace(
            changed, resume=ResumeSpec(optimizer_step=at_step, data_parallel_size=after)
        )
        try:
            resumed = plan(asked)
        except PlanError:
            return False
        run = resumed.sampler.optimizer_steps_per_epoch if resumed.sampler else 0
        epochs = dataset.epochs or 1
        return resumed.resume is not None and resumed.resume.same_global_batches and run * epochs >= steps

    def sized(n: int) -> PlanRequest:
        return dataclasses.replace(trained, dataset=dataclasses.replace(dataset, num_samples=n))

    # A bounded search (admission plans each): the sizes next to it, and the whole global
    # batches either side (an epoch that fills its last step ends alike on any replicas).
    n = dataset.num_samples
    near = {*range(n - 8, n + 9), *(batch * (n // batch + j) for j in range(-8, 9))} - {n}
    below = next((m for m in sorted(near, reverse=True) if 0 < m < n and exact(sized(m))), None)
    above = next((m for m in sorted(near) if m > n and exact(sized(m))), None)
    fixes: dict[str, list[int]] = {}
    if below is not None or above is not None:
        fixes["dataset.num_samples"] = [m for m in (below, above) if m is not None]
    return fixes


def _working(trained: PlanRequest, at_step: int, most: int) -> list[int]:
    """Up to a few data-parallel sizes, at most `most`, on which the run resumes exactly,
    the largest first."""
    found: list[int] = []
    for size in range(most, 0, -1):
        asked = dataclasses.replace(
            trained, resume=ResumeSpec(optimizer_step=at_step, data_parallel_size=size)
        )
        try:
            resume = plan(asked).resume
        except PlanError:
            continue
        if resume is not None and resume.same_global_batches:
            found.append(size)
        if len(found) == _SUGGESTED:
            break
    return found
