"""What a check of several steps runs, decided from the plan before any rank does: the run's
plan request (its defaults), the spec of one step left as it was, and which run-level controls
can change the run, each skipped one with its reason."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from app.contract.codec import encode
from app.contract.kinds.run import DEFAULT_RUN_RECIPE
from app.contract.request import build_spec, check_request
from app.worker.checks.run.controls import run_controls
from app.worker.training.plan_steps import dataset_size, run_steps

FOUR = {"num_nodes": 1, "gpus_per_node": 4}
WARMUP = {"base_lr": 0.1, "rule": "none", "warmup_steps": 4, "warmup_start_lr": 0.0, "max_grad_norm": 1.0}


def _skipped(plan: dict[str, Any], steps: int) -> dict[str, str]:
    """The run-level controls skipped on the run a check of `plan` over `steps` trains."""
    run_plan = build_spec(check_request({"plan": plan, "steps": steps})).run_plan
    assert run_plan is not None
    _, skipped = run_controls(run_plan, steps)
    return {s.name: s.reason for s in skipped}


def test_one_step_is_the_check_as_it_was() -> None:
    plan = {"topology": FOUR, "global_batch_size": 64, "micro_batch_size": 8}
    before = build_spec(check_request({"plan": plan}))
    assert build_spec(check_request({"plan": plan, "steps": 1})) == before
    assert before.steps == 1 and before.run_plan is None
    assert encode(before) == encode(build_spec(check_request({"plan": plan, "steps": 1})))


def test_a_run_gets_a_dataset_that_crosses_an_epoch_and_a_recipe_when_the_plan_has_none() -> None:
    plan = {"topology": FOUR, "global_batch_size": 64, "micro_batch_size": 8}
    spec = build_spec(check_request({"plan": plan, "steps": 5, "seed": 9}))
    planned = spec.run_plan
    assert planned is not None and planned.sampler is not None and planned.learning_rate is not None
    assert (spec.num_samples, spec.shuffle, spec.data_seed) == (64 * 3, True, 9)
    assert planned.sampler.total_size == 64 * 3
    recipe = planned.learning_rate
    assert (recipe.base_lr, recipe.rule, recipe.optimizer) == (
        DEFAULT_RUN_RECIPE.base_lr,
        DEFAULT_RUN_RECIPE.rule,
        DEFAULT_RUN_RECIPE.optimizer,
    )
    epochs = [e for e, _ in run_steps(planned, dataset_size(planned), 5)]
    assert epochs == [0, 0, 0, 1, 1]
    assert (spec.num_samples, spec.total_size) == (192, 192)
    # The plan's own dataset and recipe are kept as they are.
    given = {**plan, "dataset": {"num_samples": 1000, "seed": 2}, "learning_rate": WARMUP}
    kept = build_spec(check_request({"plan": given, "steps": 5}))
    assert kept.run_plan is not None and kept.run_plan.learning_rate is not None
    assert (kept.num_samples, kept.data_seed) == (1000, 2)
    assert kept.run_plan.learning_rate.warmup_steps == WARMUP["warmup_steps"]
    assert kept.run_plan.learning_rate.max_grad_norm == WARMUP["max_grad_norm"]


def test_the_scheduler_controls_run_where_the_lr_they_read_differs() -> None:
    accumulated = {"topology": FOUR, "global_batch_size": 64, "micro_batch_size": 8}
    assert _skipped({**accumulated, "learning_rate": WARMUP}, 6) == {}  # each changes this run
    constant = _skipped({**accumulated, "learning_rate": {"base_lr": 0.1}}, 6)
    assert constant["scheduler_per_micro_batch"] == constant["scheduler_per_process"]
    assert constant["scheduler_per_process"].startswith("the schedule gives the same lr at every step")
    # Past the warmup a constant lr is the same whichever step the scheduler is at.
    late = {**WARMUP, "warmup_steps": 1, "warmup_start_lr": 0.1}
    assert "scheduler_per_process" in _skipped({**accumulated, "learning_rate": late}, 6)
    single = _skipped(
        {"topology": {"num_nodes": 1, "gpus_per_node": 1}, "global_batch_size": 8, "learning_rate": WARMUP}, 6
    )
    assert (
        single["scheduler_per_process"] == "one process: the scheduler steps once per optimizer step anyway"
    )
    assert single["scheduler_per_micro_batch"].startswith("gradient_accumulation_steps is 1")
    assert single["clip_before_all_reduce"] == "one replica: its own gradient is the all-reduced one"


def test_set_epoch_matters_from_the_second_epoch_of_a_shuffled_dataset() -> None:
    plan = {"topology": FOUR, "global_batch_size": 16, "learning_rate": WARMUP}
    within = _skipped({**plan, "dataset": {"num_samples": 160}}, 10)
    assert within["set_epoch_missing"] == (
        "the 10 steps stay within the first epoch (10 optimizer steps): set_epoch changes the order "
        "from the second"
    )
    assert "set_epoch_missing" not in _skipped({**plan, "dataset": {"num_samples": 160}}, 11)
    unshuffled = _skipped({**plan, "dataset": {"num_samples": 32, "shuffle": False}}, 6)
    assert unshuffled["set_epoch_missing"].startswith("the dataset is not shuffled")
    no_clip = _skipped({**plan, "learning_rate": {**WARMUP, "max_grad_norm": None}}, 6)
    assert no_clip["clip_before_all_reduce"] == "the recipe does not clip (no learning_rate.max_grad_norm)"
