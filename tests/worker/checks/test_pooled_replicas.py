"""Replicas pooled into one backward per replica group: the same verdicts and figures as one
backward per replica on real gloo ranks, a wrong loss scale on one group of a mixed cluster
still fails the check, and a 100,000-replica mixed cluster passes over HTTP on warm ranks."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from fastapi.testclient import TestClient
from support.polling import check_result

from app.contract.codec import encode
from app.contract.request import build_spec, check_request
from app.worker.checks import ddp_check
from app.worker.checks.driver import run_spec
from app.worker.checks.result_parts import CheckGroup
from app.worker.training.workload import load
from tests.support.gloo_ranks import on_ranks

THREE_GROUPS = {
    "node_groups": [
        {"name": "h100", "num_nodes": 1, "gpus_per_node": 4, "relative_throughput": 2.0},
        {"name": "a100", "num_nodes": 1, "gpus_per_node": 4, "relative_throughput": 1.5},
        {"name": "v100", "num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 1.0},
    ]
}
PLANS: dict[str, dict[str, Any]] = {
    "mixed_padded": {
        "topology": THREE_GROUPS,
        "global_batch_size": 60,
        "divisibility": "balance",
        "dataset": {"num_samples": 97, "shuffle": True, "seed": 3},
    },
    "mixed_sum_accumulated": {
        "topology": THREE_GROUPS,
        "global_batch_size": 120,
        "gradient_accumulation_steps": 2,
        "divisibility": "balance",
        "loss_reduction": "sum",
    },
    "even_accumulated": {
        "topology": {"num_nodes": 1, "gpus_per_node": 8},
        "global_batch_size": 64,
        "micro_batch_size": 4,
    },
}
# Figures that pooling moves by rounding only (a sum in another order).
ROUNDED = {"rel_l2", "max_abs_diff", "timings_s", "setup_s", "controls"}

MIXED_100K: dict[str, Any] = {
    "topology": {
        "node_groups": [
            {"name": "h100", "num_nodes": 5000, "gpus_per_node": 8, "relative_throughput": 2.0},
            {"name": "a100", "num_nodes": 5000, "gpus_per_node": 8, "relative_throughput": 1.5},
            {"name": "v100", "num_nodes": 2500, "gpus_per_node": 8, "relative_throughput": 1.0},
        ]
    },
    "global_batch_size": 300_000,
    "divisibility": "balance",
    "dataset": {"num_samples": 1_000_003, "shuffle": True, "seed": 0},
}


def _one_group_wrong(spec: Any) -> Any:
    """The plan with a wrong loss scale on its last replica group alone: the first group's
    where they differ (a config copied between node types), else twice its own."""
    first, last = spec.slices[0], spec.slices[-1]
    wrong = first.loss_scale if first.loss_scale != last.loss_scale else 2 * last.loss_scale
    return dataclasses.replace(spec, slices=(*spec.slices[:-1], dataclasses.replace(last, loss_scale=wrong)))


def _answers(rank: int, world: int) -> dict[str, Any]:
    group = CheckGroup(rank, world, torch.device("cpu"), "gloo")
    out: dict[str, Any] = {}
    for name, plan in PLANS.items():
        spec = build_spec(check_request({"plan": plan}))
        workload = load(spec.model, None, spec.seed)
        answers = []
        for pool_from in (0, 1 << 30):  # every group pooled; then one backward per replica
            ddp_check.POOL_FROM_LOCAL_REPLICAS = pool_from
            answers.append(run_spec(spec, group, workload, None))
            if name.startswith("mixed"):
                answers.append(run_spec(_one_group_wrong(spec), group, workload, None))
        if rank == 0:
            out[name] = [encode(a) for a in answers]
    return out


@pytest.mark.slow
def test_pooled_groups_answer_as_one_backward_per_replica_and_catch_one_wrong_group_scale() -> None:
    answers = on_ranks(2, _answers)[0]
    for name, found in answers.items():
        mixed = name.startswith("mixed")
        pooled, apart = (found[0], found[2]) if mixed else (found[0], found[1])
        assert pooled["passed"] and apart["passed"], name
        assert pooled["rel_l2"] < 1e-12 and apart["rel_l2"] < 1e-12, name
        assert {k: v for k, v in pooled.items() if k not in ROUNDED} == {
            k: v for k, v in apart.items() if k not in ROUNDED
        }, name
        for new, old in zip(pooled["controls"], apart["controls"], strict=True):
            assert (new["name"], new["detected"]) == (old["name"], old["detected"]), name
            assert new["rel_l2"] == pytest.approx(old["rel_l2"], rel=1e-9), (name, new["name"])
        if mixed:
            # One group's wrong scale: pooled or not, the gradient is another one, and fails.
            for wrong in (found[1], found[3]):
                assert not wrong["passed"] and wrong["rel_l2"] > 1e-3, (name, wrong["rel_l2"])
            assert found[1]["rel_l2"] == pytest.approx(found[3]["rel_l2"], rel=1e-9), name


@pytest.mark.slow
def test_a_100000_replica_mixed_cluster_passes_over_http_on_warm_ranks(default_worker: TestClient) -> None:
    result = check_result(default_worker, {"plan": MIXED_100K}, timeout=240)
    assert result["passed"], result
    assert result["data_parallel_size"] == 100_000 and result["split"] == "proportional"
    assert len(result["micro_batch_sizes"]) >= 3
    detected = {c["name"]: c["detected"] for c in result["controls"]}
    assert detected["unweighted_mean"] and detected["no_distributed_sampler"], detected
