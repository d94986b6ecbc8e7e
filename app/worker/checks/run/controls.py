"""The run-level controls of a check of several optimizer steps: mistakes that leave the first
step's gradient right and change the run after it. Each is the reference run with one
departure (`reference_run.RunVariant`), trained on rank 0 beside the reference, which is the
trajectory the mistake produces: tests/worker/checks/run/test_run_mistakes.py runs each mistake the
literal way under torchrun (DDP, a real scheduler, sampler and clipping) and holds it to this.

A control runs where it changes this plan's run over the steps asked, decided exactly where the
plan alone decides it (the lr each step would run at, the samples each step would read); else
it is skipped with the reason. Clipping is decided by the run: a control whose clipping never
bites (no replica's gradient and no all-reduced one above max_grad_norm) is skipped then.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.contract.check_result import SkippedControl
from app.core.learning_rate.recipe_summary import lr_of
from app.core.records.plan import Plan
from app.worker.checks.controls import Control
from app.worker.training.plan_steps import dataset_size, run_steps
from app.worker.training.reference_run import RunVariant


@dataclass(frozen=True, slots=True)
class RunControl(Control):
    """A mistake in how a run steps its scheduler, its sampler or its clipping."""


SCHEDULER_PER_MICRO_BATCH = RunControl(
    "scheduler_per_micro_batch",
    "scheduler.step() after every micro-batch's backward instead of after each optimizer step: "
    "optimizer step k runs at the schedule's step k x accumulation + accumulation - 1 (warmup and "
    "decay counted in micro-steps)",
)
SCHEDULER_PER_PROCESS = RunControl(
    "scheduler_per_process",
    "the scheduler stepped once per process per optimizer step, as Accelerate's prepared scheduler "
    "(AcceleratedScheduler.step without split_batches) does: step k runs at the schedule's step "
    "k x processes",
)
SET_EPOCH_MISSING = RunControl(
    "set_epoch_missing",
    "sampler.set_epoch(epoch) never called: every epoch reads the first epoch's order",
)
CLIP_BEFORE_ALL_REDUCE = RunControl(
    "clip_before_all_reduce",
    "each replica clips its own accumulated gradient to max_grad_norm before DDP averages them, "
    "instead of clipping the all-reduced gradient",
)
RUN_CONTROLS = (SCHEDULER_PER_MICRO_BATCH, SCHEDULER_PER_PROCESS, SET_EPOCH_MISSING, CLIP_BEFORE_ALL_REDUCE)


def clip_never_bites(plan: Plan) -> SkippedControl:
    clip = plan.learning_rate.max_grad_norm if plan.learning_rate else None
    return SkippedControl(
        CLIP_BEFORE_ALL_REDUCE.name,
        f"clipping never bites on these steps: every replica's gradient norm and the all-reduced one "
        f"stay below max_grad_norm {clip!r}, so clipping either is no clipping",
    )


def _same_lr(plan: Plan, steps: int, per_step: int, offset: int) -> bool:
    """Whether step k's lr equals the schedule's at step k x per_step + offset, for every k."""
    lr = plan.learning_rate
    assert lr is not None
    return all(lr_of(lr, k) == lr_of(lr, k * per_step + offset) for k in range(steps))


def _constant(steps: int) -> str:
    return f"the schedule gives the same lr at every step the mistake reaches over these {steps} steps"


Variant = tuple[RunVariant | None, str | None]  # the mistake's run, or why it trains the plan's


def _scheduler_per_micro_batch(plan: Plan, steps: int) -> Variant:
    g = plan.gradient_accumulation_steps
    if g == 1:
        return None, "gradient_accumulation_steps is 1: every micro-batch is an optimizer step"
    if _same_lr(plan, steps, g, g - 1):
        return None, _constant(steps)
    return RunVariant(scheduler_step=lambda k: k * g + g - 1), None


def _scheduler_per_process(plan: Plan, steps: int) -> Variant:
    processes = plan.world_size
    if processes == 1:
        return None, "one process: the scheduler steps once per optimizer step anyway"
    if _same_lr(plan, steps, processes, 0):
        return None, _constant(steps)
    return RunVariant(scheduler_step=lambda k: k * processes), None


def _set_epoch_missing(plan: Plan, steps: int) -> Variant:
    assert plan.sampler is not None
    if not plan.sampler.shuffle:
        return None, "the dataset is not shuffled: every epoch reads the same order, set_epoch or not"
    per_epoch = plan.sampler.optimizer_steps_per_epoch
    if steps <= per_epoch:
        return None, (
            f"the {steps} steps stay within the first epoch ({per_epoch} optimizer steps): "
            f"set_epoch changes the order from the second"
        )
    n = dataset_size(plan)
    if list(run_steps(plan, n, steps)) == list(run_steps(plan, n, steps, lambda e: 0)):
        return None, "on these steps every later epoch's order gives the first epoch's batches"
    return RunVariant(sampler_epoch=lambda e: 0), None


def _clip_before_all_reduce(plan: Plan, steps: int) -> Variant:
    assert plan.learning_rate is not None
    if plan.learning_rate.max_grad_norm is None:
        return None, "the recipe does not clip (no learning_rate.max_grad_norm)"
    if plan.data_parallel_size == 1:
        return None, "one replica: its own gradient is the all-reduced one"
    return RunVariant(clip_per_replica=True), None


_VARIANTS = {
    SCHEDULER_PER_MICRO_BATCH.name: _scheduler_per_micro_batch,
    SCHEDULER_PER_PROCESS.name: _scheduler_per_process,
    SET_EPOCH_MISSING.name: _set_epoch_missing,
    CLIP_BEFORE_ALL_REDUCE.name: _clip_before_all_reduce,
}


def _variant(control: RunControl, plan: Plan, steps: int) -> Variant:
    """The mistake's run on this plan, or why it would train the plan's run exactly."""
    assert plan.learning_rate is not None and plan.sampler is not None
    return _VARIANTS[control.name](plan, steps)


def run_controls(plan: Plan, steps: int) -> tuple[list[tuple[RunControl, RunVariant]], list[SkippedControl]]:
    """The run-level controls that change this plan's run (each with its run), and the others
    with the reason each would train the plan's run exactly."""
    applicable: list[tuple[RunControl, RunVariant]] = []
    skipped: list[SkippedControl] = []
    for control in RUN_CONTROLS:
        variant, reason = _variant(control, plan, steps)
        if variant is not None:
            applicable.append((control, variant))
        else:
            skipped.append(SkippedControl(control.name, reason or ""))
    return applicable, skipped
