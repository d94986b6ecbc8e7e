"""Which controls apply to a plan: exact, in rationals, over the samples they read."""

from __future__ import annotations

from fractions import Fraction

import pytest

from app.contract.request import build_spec, check_request
from app.contract.spec import CheckSpec, replica_range
from app.contract.spec_error import SpecError
from app.worker.checks.controls import CONTROLS, split_controls, weight_ratio


def _spec(body: dict[str, object]) -> CheckSpec:
    return build_spec(check_request({"plan": body}))


def test_reference_weights_equal_themselves() -> None:
    batch = [3, 1, 4, 1, 5]
    assert weight_ratio([(batch, Fraction(2), "mean", 1)], batch, 2) == 1
    # two replicas reading halves with the right scale are the mean over the whole batch
    halves = [([3, 1], Fraction(2 * 2, 4), "mean", 1), ([4, 5], Fraction(2 * 2, 4), "mean", 1)]
    assert weight_ratio(halves, [3, 1, 4, 5], 2) == 1
    assert (
        weight_ratio(
            [([3, 1], Fraction(1), "mean", 1), ([4, 5, 9], Fraction(1), "mean", 1)], [3, 1, 4, 5, 9], 2
        )
        != 1
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


PLAIN_MEAN_RIGHT = "every replica has the same micro-batch, so a plain mean is already right"
NOTHING_TO_DIVIDE = "gradient_accumulation_steps is 1, so there is nothing to divide by"
SINGLE_SAMPLE = (
    "each replica's step is a single sample (micro-batch 1, no accumulation), so its sum is its mean"
)
ONE_READS_ALL = "one replica already reads the whole global batch"
MEAN_AVERAGES = (
    "with mean-reduced losses at the plan's scales, replicas that each read the whole global "
    "batch average to the right gradient: the mistake costs compute, not correctness"
)
NO_SHARD = "one replica: there is no shard to miss"
FOUR = {"num_nodes": 1, "gpus_per_node": 4}
MIXED = {
    "node_groups": [
        {"name": "a", "num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 2.0},
        {"name": "b", "num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 1.0},
    ]
}


@pytest.mark.parametrize(
    "plan, skipped",
    [
        (
            {"topology": FOUR, "global_batch_size": 64, "micro_batch_size": 8},
            {"unweighted_mean": PLAIN_MEAN_RIGHT, "whole_global_batch": MEAN_AVERAGES},
        ),
        (
            {"topology": {"num_nodes": 1, "gpus_per_node": 1}, "global_batch_size": 16},
            {
                "unweighted_mean": PLAIN_MEAN_RIGHT,
                "accumulation_not_divided": NOTHING_TO_DIVIDE,
                "whole_global_batch": ONE_READS_ALL,
                "no_distributed_sampler": NO_SHARD,
            },
        ),
        (
            {"topology": FOUR, "global_batch_size": 4},
            {
                "unweighted_mean": PLAIN_MEAN_RIGHT,
                "accumulation_not_divided": NOTHING_TO_DIVIDE,
                "sum_without_scaling": SINGLE_SAMPLE,
                "whole_global_batch": MEAN_AVERAGES,
            },
        ),
        (
            {"topology": FOUR, "global_batch_size": 32, "loss_reduction": "sum"},
            {"unweighted_mean": PLAIN_MEAN_RIGHT, "accumulation_not_divided": NOTHING_TO_DIVIDE},
        ),
        (
            {"topology": MIXED, "global_batch_size": 24, "loss_reduction": "sum"},
            {"accumulation_not_divided": NOTHING_TO_DIVIDE},
        ),
    ],
)
def test_every_control_runs_or_says_why_not(plan: dict[str, object], skipped: dict[str, str]) -> None:
    pytest.importorskip("torch")
    from app.worker.checks.shards import Shards

    spec = _spec(plan)
    shards = Shards(spec)
    ran, not_run = split_controls(spec, shards.every_replica, shards.epoch)
    assert {s.name: s.reason for s in not_run} == skipped
    assert [c.name for c in ran] == [c.name for c in CONTROLS if c.name not in skipped]


def test_a_control_no_rule_covers_still_says_why_it_did_not_run() -> None:
    # Two replicas over a one-sample dataset read the same sample: the unsharded read is the
    # sharded one, though two replicas have shards.
    pytest.importorskip("torch")
    from app.worker.checks.shards import Shards

    spec = _spec(
        {
            "topology": {"num_nodes": 1, "gpus_per_node": 2},
            "global_batch_size": 2,
            "dataset": {"num_samples": 1},
        }
    )
    shards = Shards(spec)
    _, not_run = split_controls(spec, shards.every_replica, shards.epoch)
    reasons = {s.name: s.reason for s in not_run}
    assert reasons["no_distributed_sampler"].startswith("on this plan's first step it weighs every sample")


def test_the_int64_sums_decide_as_the_exact_python_integers_do() -> None:
    """On the reads of every control of plans even, uneven, accumulated, summed, padded and
    emulated, and on random reads with repeated samples: the same answer both ways."""
    import random

    pytest.importorskip("torch")
    from app.worker.checks.controls import weight_ratio_in_python
    from app.worker.checks.shards import Shards

    plans = [
        {"topology": FOUR, "global_batch_size": 64, "micro_batch_size": 8},
        {"topology": FOUR, "global_batch_size": 32, "loss_reduction": "sum"},
        {"topology": MIXED, "global_batch_size": 24, "loss_reduction": "sum"},
        {"topology": MIXED, "global_batch_size": 48, "micro_batch_size": 4},
        {"topology": FOUR, "global_batch_size": 12, "dataset": {"num_samples": 10}},
        {"topology": {"num_nodes": 2, "gpus_per_node": 8}, "global_batch_size": 256},
    ]
    cases = 0
    for plan in plans:
        spec = _spec(plan)
        shards = Shards(spec)
        for control in CONTROLS:
            reads = shards.every_replica(control)
            dp = spec.data_parallel_size
            assert weight_ratio(reads, shards.epoch, dp) == weight_ratio_in_python(reads, shards.epoch, dp)
            cases += 1
    draw = random.Random(7)
    answers = set()
    ratios = set()
    for _ in range(200):
        reference = [draw.randrange(6) for _ in range(draw.randrange(1, 7))]
        reads = [
            (
                [draw.randrange(6) for _ in range(draw.randrange(1, 4))],
                Fraction(draw.randrange(1, 5), draw.randrange(1, 5)),
                draw.choice(["mean", "sum"]),
                draw.randrange(1, 3),
            )
            for _ in range(draw.randrange(1, 4))
        ]
        dp = draw.randrange(1, 4)
        times = draw.choice([1, 1, 3, Fraction(1, 2)])
        if draw.random() < 0.4:  # the reference's samples, summed at times/G in two parts
            cut = draw.randrange(len(reference) + 1)
            shuffled = draw.sample(reference, len(reference))
            weight = Fraction(dp, len(reference)) * times
            reads = [(p, weight, "sum", 1) for p in (shuffled[:cut], shuffled[cut:]) if p]
        ratio = weight_ratio(reads, reference, dp)
        assert ratio == weight_ratio_in_python(reads, reference, dp)
        answers.add(ratio != 1)  # whether the control changes the gradient
        ratios.add(ratio)
    assert cases == 30 and answers == {True, False}
    assert {None, 1, 3, Fraction(1, 2)} <= ratios
