"""The controls computed together (one backward per distinct micro-batch, one all-reduce; a
control that weighs every sample of the global batch alike, the reference gradient times that
weight) against each control stepped through DDP on its own, as every check did before: on
real gloo ranks, the same controls with the same verdicts, their rel_l2 equal to 1e-12 in
float64, and every other field of the answer byte-identical."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from app.contract.codec import encode
from app.contract.request import build_spec, check_request
from app.worker.checks import ddp_check, token_check
from app.worker.checks.driver import run_spec
from app.worker.checks.result_parts import CheckGroup
from app.worker.training.sync_batch_norm import forward_is_collective
from app.worker.training.workload import load
from tests.support.gloo_ranks import on_ranks

FOUR = {"num_nodes": 1, "gpus_per_node": 4}
MIXED = {
    "node_groups": [
        {"name": "a", "num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 2.0},
        {"name": "b", "num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 1.0},
    ]
}
# Two processes each: four replicas are two emulated per process.
PLANS: dict[str, dict[str, Any]] = {
    "even_accumulated_emulated": {"topology": FOUR, "global_batch_size": 64, "micro_batch_size": 8},
    "uneven": {"topology": MIXED, "global_batch_size": 48, "micro_batch_size": 4},
    "uneven_sum": {"topology": MIXED, "global_batch_size": 24, "loss_reduction": "sum"},
    "sum_reduction": {"topology": FOUR, "global_batch_size": 32, "loss_reduction": "sum"},
    "padded": {"topology": FOUR, "global_batch_size": 24, "dataset": {"num_samples": 26}},
    "one_replica_each": {
        "topology": {"num_nodes": 1, "gpus_per_node": 2},
        "global_batch_size": 16,
        "micro_batch_size": 4,
    },
    "tokens": {
        "topology": {"num_nodes": 1, "gpus_per_node": 4},
        "sequence_length": 16,
        "global_batch_tokens": 32 * 16,
        "micro_batch_tokens": 4 * 16,
        "loss_normalization": "token",
    },
}


def _answers(rank: int, world: int) -> dict[str, Any]:
    group = CheckGroup(rank, world, torch.device("cpu"), "gloo")
    out: dict[str, Any] = {}
    weighed: list[int] = []  # how many controls each call weighed with passes of their own

    def counted(module: Any, runs: Any, feed: Any) -> Any:
        weighed.append(len(runs))
        return WEIGHTED(module, runs, feed)

    for name, plan in PLANS.items():
        spec = build_spec(check_request({"plan": plan}))
        workload = load(spec.model, None, spec.seed)
        weighed.clear()
        ddp_check.weighted_gradients = counted
        batched = run_spec(spec, group, workload, None)
        ddp_check.weighted_gradients = WEIGHTED
        # Each control through DDP on its own, none as a multiple of the reference: the path a
        # module whose forward is a collective takes.
        ddp_check.forward_is_collective = token_check.forward_is_collective = lambda m: True
        independent = type(workload).independent_samples
        type(workload).independent_samples = property(lambda _: False)
        one_by_one = run_spec(spec, group, workload, None)
        ddp_check.forward_is_collective = token_check.forward_is_collective = forward_is_collective
        type(workload).independent_samples = independent
        if rank == 0:
            assert batched is not None and one_by_one is not None
            out[name] = (encode(batched), encode(one_by_one), list(weighed))
    return out


WEIGHTED = ddp_check.weighted_gradients
APART = {"no_distributed_sampler", "unweighted_mean"}


@pytest.mark.slow
def test_batched_controls_give_every_control_the_verdict_and_rel_l2_of_one_by_one() -> None:
    answers = on_ranks(2, _answers)[0]
    ran = set()
    for name, (batched, one_by_one, weighed) in answers.items():
        # Only a control that reads other samples than the reference batch (replica 0's on
        # every replica), or weighs some of its samples apart (plain means of uneven
        # replicas), takes passes of its own; every other one here weighs each sample of the
        # global batch alike, and is the reference gradient times that weight.
        apart = [c["name"] for c in batched["controls"] if c["name"] in APART]
        assert weighed == ([] if name == "tokens" else [len(apart)]), (name, weighed, apart)
        assert [c["name"] for c in batched["controls"]] == [c["name"] for c in one_by_one["controls"]], name
        for new, old in zip(batched["controls"], one_by_one["controls"], strict=True):
            assert new["detected"] == old["detected"] is True, (name, new["name"])
            for figure in ("rel_l2", "max_abs_diff"):
                assert new[figure] == pytest.approx(old[figure], rel=1e-12, abs=0), (name, new["name"])
            ran.add(new["name"])
        differing = {"controls", "timings_s", "setup_s"}
        assert {k: v for k, v in batched.items() if k not in differing} == {
            k: v for k, v in one_by_one.items() if k not in differing
        }, name
    assert ran == {
        "accumulation_not_divided",
        "sum_without_scaling",
        "whole_global_batch",
        "no_distributed_sampler",
        "unweighted_mean",
        "mean_per_micro_batch",
        "mean_per_replica",
        "padding_counted",
    }
