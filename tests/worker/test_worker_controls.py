"""Which controls apply to a plan: exact, in rationals, over the samples they read."""

from __future__ import annotations

from fractions import Fraction

import pytest

from app.worker.controls import CONTROLS, changes_gradient
from app.worker.request import spec_from_request
from app.worker.spec import CheckSpec, SpecError, replica_range


def _spec(body: dict[str, object]) -> CheckSpec:
    return spec_from_request({"plan": body})


def test_reference_weights_equal_themselves() -> None:
    batch = [3, 1, 4, 1, 5]
    assert not changes_gradient([(batch, Fraction(2), "mean", 1)], batch, 2)
    # two replicas reading halves with the right scale are the mean over the whole batch
    halves = [([3, 1], Fraction(2 * 2, 4), "mean", 1), ([4, 5], Fraction(2 * 2, 4), "mean", 1)]
    assert not changes_gradient(halves, [3, 1, 4, 5], 2)
    assert changes_gradient(
        [([3, 1], Fraction(1), "mean", 1), ([4, 5, 9], Fraction(1), "mean", 1)], [3, 1, 4, 5, 9], 2
    )


def test_controls_and_their_scales() -> None:
    names = [c.name for c in CONTROLS]
    assert names == [
        "unweighted_mean",
        "accumulation_not_divided",
        "sum_without_scaling",
        "whole_global_batch",
        "no_distributed_sampler",
    ]
    spec = _spec(
        {"topology": {"num_nodes": 1, "gpus_per_node": 4}, "global_batch_size": 64, "micro_batch_size": 8}
    )
    assert spec.gradient_accumulation_steps == 2
    by_name = {c.name: c for c in CONTROLS}
    assert by_name["accumulation_not_divided"].loss_scale(spec, 8) == 1
    assert by_name["unweighted_mean"].loss_scale(spec, 8) == Fraction(1, 2) == spec.exact_loss_scale(8)


def test_dataset_too_small_for_one_step_names_the_field() -> None:
    with pytest.raises(SpecError) as err:
        _spec(
            {
                "topology": {"num_nodes": 1, "gpus_per_node": 4},
                "global_batch_size": 64,
                "dataset": {"num_samples": 10},
            }
        )
    assert err.value.pointer == "/plan/dataset/num_samples"


def test_replica_ranges_cover_every_replica_once() -> None:
    for processes, replicas in [(4, 1024), (3, 10), (4, 4), (2, 3)]:
        covered = [r for p in range(processes) for r in replica_range(p, processes, replicas)]
        assert covered == list(range(replicas))
