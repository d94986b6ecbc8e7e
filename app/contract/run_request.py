"""A check of several optimizer steps (`steps` above 1): the plan request its run trains, with
what a run needs and the request left out filled in, and the requests it refuses. Pure
(standard library and the core): the web process builds it, every rank plans it again.

- Without a dataset, the run gets one small enough to cross an epoch boundary: an epoch of
  ceil(steps / 2) optimizer steps (so the second epoch's order, set_epoch's work, is read),
  shuffled with the check's seed.
- Without a learning_rate, the run trains plain SGD at 0.1 (rule none) with the recipe's other
  defaults: momentum 0.9, no warmup, a constant lr, no weight decay, no clipping.
"""

from __future__ import annotations

import dataclasses

from app.contract.mesh_spec import mesh_sizes
from app.core.errors.domain import InvalidValue
from app.core.planner import law_request, plan
from app.core.records.plan import Plan
from app.core.records.plan_request import DatasetSpec, LearningRateSpec, LRRule, Optimizer, PlanRequest

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
