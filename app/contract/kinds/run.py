"""A check of several optimizer steps (`steps` above 1), the contract half: the plan request its
run trains, with what a run needs and the request left out filled in, the requests it refuses,
and what the run found beside its first step (`RunOutcome`). Pure (standard library and the
core): the web process builds it, every rank plans it again.

- Without a dataset, the run gets one small enough to cross an epoch boundary: an epoch of
  ceil(steps / 2) optimizer steps (so the second epoch's order, set_epoch's work, is read),
  shuffled with the check's seed.
- Without a learning_rate, the run trains plain SGD at 0.1 (rule none) with the recipe's other
  defaults: momentum 0.9, no warmup, a constant lr, no weight decay, no clipping.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

from app.contract.codec import named
from app.contract.kinds.part import RequestPart, Trained
from app.contract.mesh_spec import mesh_sizes
from app.core.errors.domain import InvalidValue, PlanError
from app.core.planner import law_request, plan
from app.core.records.plan import Plan
from app.core.records.plan_request import DatasetSpec, LearningRateSpec, LRRule, Optimizer, PlanRequest

if TYPE_CHECKING:
    from app.contract.request import CheckRequest
    from app.contract.spec import CheckSpec

DEFAULT_RUN_RECIPE = LearningRateSpec(base_lr=0.1, rule=LRRule.NONE, optimizer=Optimizer.SGD)


def default_epoch_steps(steps: int) -> int:
    """Optimizer steps in the epoch a run gets without a dataset: the run crosses into a second."""
    return max(1, -(-steps // 2))


def run_request(request: PlanRequest, planned: Plan, steps: int, seed: int) -> PlanRequest:
    """The plan request a run of `steps` trains: `request` with a dataset and a recipe where it
    has none (`planned` is its plan, for the global batch). A scaling law's batch and recipe
    are written in first: the run trains what the plan runs."""
    request = law_request(request)
    dataset = request.dataset or DatasetSpec(
        num_samples=planned.global_batch_size * default_epoch_steps(steps), shuffle=True, seed=seed
    )
    return dataclasses.replace(
        request, dataset=dataset, learning_rate=request.learning_rate or DEFAULT_RUN_RECIPE
    )


def planned_run(request: PlanRequest, *, on_samples: bool = False) -> Plan:
    """The plan a run trains. `on_samples`: a token-normalised plan checked on the synthetic
    samples weighs each micro-batch as the mean loss does (data_parallel_size x micro /
    global), as its first step does (spec.py)."""
    return weighed_on_samples(plan(request), on_samples)


def weighed_on_samples(planned: Plan, on_samples: bool) -> Plan:
    """`planned`, its micro-batches weighed as the mean loss does where it runs on samples."""
    if not on_samples or all(g.loss_scale is not None for g in planned.replica_groups):
        return planned
    dp, G = planned.data_parallel_size, planned.global_batch_size
    groups = tuple(
        dataclasses.replace(g, loss_scale=dp * g.micro_batch_size / G) for g in planned.replica_groups
    )
    return dataclasses.replace(planned, replica_groups=groups)


def refuse_for_a_run(planned: Plan, steps: int, *, fit: bool) -> None:
    """What a run of `steps` cannot do, each a 422 at the field to change."""
    if fit:
        raise InvalidValue(
            "the micro-batch search re-plans the check, and a run trains the plan it was given: "
            "search with steps 1, then check the plan it gives (micro_batch_search.planned.plan_request) "
            "over several steps",
            pointer="/fit_micro_batch",
        )
    lr = planned.learning_rate
    if lr is not None and lr.train_steps is not None and steps > lr.train_steps:
        raise InvalidValue(
            f"steps {steps} is longer than the recipe's run of {lr.train_steps} optimizer steps "
            f"(learning_rate.train_steps, train_samples or dataset.epochs): check at most the whole run",
            pointer="/steps",
            suggestions={"steps": [lr.train_steps]},
        )
    _refuse_short_pipeline_steps(planned, steps)


def _refuse_short_pipeline_steps(planned: Plan, steps: int) -> None:
    """A pipeline schedule splits a step's batch into equal micro-batches (tensor_split): a step
    that reads an epoch's short last micro-batch cannot run as the plan weighs it."""
    sizes, sampler, micro = mesh_sizes(planned), planned.sampler, planned.micro_batch_size
    if sizes is None or sizes["pp"] == 1 or sampler is None or not micro or planned.split != "even":
        return
    short = (sampler.total_size // planned.data_parallel_size) % micro
    if short and not sampler.leftover_micro_steps and steps >= sampler.optimizer_steps_per_epoch:
        whole = sampler.total_size // planned.data_parallel_size // micro * micro
        raise InvalidValue(
            f"the epoch's last step reads a micro-batch of {short} of {micro} samples per replica, and a "
            f"pipeline schedule splits a step into equal micro-batches: give each replica's shard a "
            f"multiple of micro_batch_size ({whole} samples per replica), or stop before the epoch's last "
            f"step",
            pointer="/steps",
            suggestions={"steps": [sampler.optimizer_steps_per_epoch - 1]}
            if sampler.optimizer_steps_per_epoch > 1
            else {},
        )


class RunPart(RequestPart):
    """`steps` above 1: the check trains the run's plan request (`run_request`), refused where a
    run cannot go (`refuse_for_a_run`), and every rank runs its plan (`CheckSpec.run_plan`)."""

    option: ClassVar[str] = "steps"

    def trains(self, request: CheckRequest, trained: Trained) -> Trained:
        options = request.options
        if options.steps < 2:
            return trained
        try:
            run = run_request(trained.request, trained.plan, options.steps, options.seed)
            planned = plan(run)
        except PlanError as err:
            raise err.under("/plan") from None
        refuse_for_a_run(planned, options.steps, fit=options.fit_micro_batch is not None)
        return Trained(run, planned)

    def apply(self, request: CheckRequest, trained: Trained, spec: CheckSpec) -> CheckSpec:
        if request.options.steps < 2:
            return spec
        return dataclasses.replace(
            spec, run_plan=planned_run(trained.request, on_samples=spec.workload != "tokens")
        )


@dataclass(frozen=True, slots=True)
class TrajectoryStep:
    """One optimizer step of the plan's run beside the reference run's."""

    step: int  # from 0
    epoch: int
    lr: float  # the lr the run stepped with
    loss: float  # the run's loss over the step's global batch, weighted as the plan says
    reference_loss: float  # the reference run's, on its own weights
    params_rel_l2: float  # the run's parameters after the step against the reference's
    valid_tokens: int | None  # the step's valid tokens (loss_normalization token)
    within_tolerance: bool  # params_rel_l2 and the loss's relative difference, within the run's tolerance


def step_matches(params_rel_l2: float, loss: float, reference_loss: float, tolerance: float) -> bool:
    return (
        math.isfinite(params_rel_l2)
        and params_rel_l2 <= tolerance
        and abs(loss - reference_loss) <= tolerance * abs(reference_loss)
    )


@dataclass(frozen=True, slots=True)
class ControlStep:
    """One optimizer step of a run-level control's run (a known mistake) against the reference."""

    step: int
    lr: float
    loss: float
    params_rel_l2: float


@dataclass(frozen=True, slots=True)
class EpochEnd:
    """How the run's epochs end, as the plan says and as it ran."""

    optimizer_steps_per_epoch: int
    epochs_run: int  # epochs the run's steps touched
    leftover: Literal["dropped"]  # what happens to the micro-batches after an epoch's last whole step
    leftover_micro_steps: int  # per epoch, dropped
    # Samples in each replica's last micro-batch of an epoch when it is short (an even split
    # whose shard is not a multiple of the micro-batch): it is weighted as the plan says, its
    # mean times the replica's loss scale, like every other micro-batch. None: none is short.
    short_micro_batch_samples: int | None


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What a run found beside its first step: its trajectory against the reference run's, how
    its epochs ended, each run-level control's trajectory. A `CheckResult` lays these keys out
    in its own object (the codec's FLAT), null for a one-step check; the verdicts are derived
    from the measurements."""

    trajectory: tuple[TrajectoryStep, ...]
    # Per step: parameters' relative L2, and the loss's relative difference.
    tolerance: float = field(metadata=named("run_tolerance"))
    epoch_end: EpochEnd
    # Each run-level control that ran, by name.
    controls: dict[str, tuple[ControlStep, ...]] = field(metadata=named("control_trajectories"))

    derived: ClassVar[tuple[str, ...]] = ("final_params_rel_l2", "trajectory_matches")

    @property
    def final_params_rel_l2(self) -> float:
        return self.trajectory[-1].params_rel_l2 if self.trajectory else math.nan

    @property
    def trajectory_matches(self) -> bool:
        return bool(self.trajectory) and all(s.within_tolerance for s in self.trajectory)
