"""A mesh check's controls as weighings of one backward per distinct micro-batch (one
all-reduce for them all) against each control stepped through the real wrappers on its own,
as every mesh check did before: on real gloo ranks, dp x tp, FSDP, HSDP, tensor only, pipeline
(with data or tensor parallel, one micro-batch or several), summed losses, uneven replicas and
a registered model's own `parallelize`; the same controls with the
same verdicts, their figures equal to 1e-12 in float64, every other field byte-identical (the
plan's own gradient, assembled from the shards in one all-reduce, against `full_tensor()` and
a gather). A control that only scales the plan's losses is the plan's gradient times a factor:
which controls took passes of their own is counted too."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from app.contract.codec import encode
from app.contract.request import build_spec, check_request
from app.worker.checks.driver import run_spec
from app.worker.checks.mesh import check as mesh_check
from app.worker.checks.result_parts import CheckGroup
from app.worker.training import mesh_gradients
from app.worker.training.workload import load
from tests.support.gloo_ranks import on_ranks


def _four(parallelism: dict[str, int], **more: Any) -> dict[str, Any]:
    return {
        "topology": {"num_nodes": 1, "gpus_per_node": 4},
        "micro_batch_size": 3,
        "gradient_accumulation_steps": 2,
        "parallelism": parallelism,
        **more,
    }


MESH_MLP = "app.worker.example_mesh_models:mesh_mlp"
# Two replicas of two ranks each, the fast one reading twice the samples of the slow one.
UNEVEN = {
    "node_groups": [
        {"name": "fast", "num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 2.0},
        {"name": "slow", "num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 1.0},
    ]
}
CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "dp2_x_tp2": (_four({"tensor": 2}), None),
    "dp2_x_tp2_summed": (_four({"tensor": 2}, loss_reduction="sum"), None),
    "tp4": (_four({"tensor": 4}), None),
    "fsdp4": (_four({"data_parallel_shard": 4}), None),
    "hsdp2x2": (_four({"data_parallel_shard": 2}, dataset={"num_samples": 100, "seed": 5}), None),
    "uneven_dp2_x_tp2": (
        {
            "topology": UNEVEN,
            "global_batch_size": 18,
            "gradient_accumulation_steps": 3,
            "parallelism": {"tensor": 2},
        },
        None,
    ),
    "registered_parallelize": (_four({"tensor": 2}), MESH_MLP),
    "pp2_x_dp2": (_four({"pipeline": 2}, gradient_accumulation_steps=4), None),
    "pp2_x_dp2_summed": (_four({"pipeline": 2}, loss_reduction="sum"), None),
    "pp2_x_tp2": (_four({"pipeline": 2, "tensor": 2}, gradient_accumulation_steps=3), None),
    "pp2_x_dp2_one_micro_batch": (_four({"pipeline": 2}, gradient_accumulation_steps=1), None),
    "uneven_pp2_x_dp2": (
        {
            "topology": UNEVEN,
            "global_batch_size": 18,
            "gradient_accumulation_steps": 3,
            "parallelism": {"pipeline": 2},
        },
        None,
    ),
}


def _answers(rank: int, world: int) -> dict[str, Any]:
    group = CheckGroup(rank, world, torch.device("cpu"), "gloo")
    out: dict[str, Any] = {}
    passes: list[int] = []  # how many controls each call weighed with passes of their own

    def counted(share: Any, steps: Any) -> Any:
        passes.append(len(steps))
        return PASSES(share, steps)

    for name, (plan, target) in CASES.items():
        body = {"plan": plan, **({"model": "mesh_mlp"} if target else {})}
        spec = build_spec(check_request(body))
        workload = load(spec.model, target, spec.seed)
        passes.clear()
        mesh_gradients._passes = counted
        weighed = run_spec(spec, group, workload, target)
        mesh_gradients._passes = PASSES
        # Each control through the real wrappers (and schedule) on its own: the path a model
        # whose micro-batches cannot be stacked takes under a pipeline.
        # And the plan's gradient through full_tensor() and one gather, not assembled in one
        # all-reduce: the rest of the answer must be byte-identical.
        mesh_check.weighable, mesh_check.assembled_gradient = (lambda *_: False), (lambda *_: None)
        one_by_one = run_spec(spec, group, workload, target)
        mesh_check.weighable, mesh_check.assembled_gradient = WEIGHABLE, ASSEMBLED
        if rank == 0:
            assert weighed is not None and one_by_one is not None
            out[name] = (encode(weighed), encode(one_by_one), list(passes))
    return out


WEIGHABLE, ASSEMBLED, PASSES = mesh_check.weighable, mesh_check.assembled_gradient, mesh_gradients._passes


@pytest.mark.slow
def test_weighed_mesh_controls_give_every_control_the_verdict_and_figures_of_one_by_one() -> None:
    answers = on_ranks(4, _answers)[0]
    ran: dict[str, set[str]] = {}
    passed: dict[str, list[int]] = {}
    for name, (weighed, one_by_one, passes) in answers.items():
        passed[name] = passes
        assert weighed["passed"] and one_by_one["passed"], name
        assert [c["name"] for c in weighed["controls"]] == [c["name"] for c in one_by_one["controls"]], name
        for new, old in zip(weighed["controls"], one_by_one["controls"], strict=True):
            assert new["detected"] == old["detected"] is True, (name, new["name"])
            for figure in ("rel_l2", "max_abs_diff"):
                assert new[figure] == pytest.approx(old[figure], rel=1e-12, abs=0), (name, new["name"])
        ran[name] = {c["name"] for c in weighed["controls"]}
        differing = {"controls", "timings_s", "setup_s"}
        assert {k: v for k, v in weighed.items() if k not in differing} == {
            k: v for k, v in one_by_one.items() if k not in differing
        }, name
    # The mesh's own mistakes ran where their reads differ between tensor peers or replicas.
    assert {"sampler_by_global_rank", "tensor_peers_see_different_data"} <= ran["dp2_x_tp2"]
    assert {"sampler_by_global_rank", "tensor_peers_see_different_data"} <= ran["uneven_dp2_x_tp2"]
    assert "replicas_from_shard_group" in ran["hsdp2x2"]
    assert "sum_without_scaling" in ran["dp2_x_tp2"] and "accumulation_not_divided" in ran["fsdp4"]
    for name in ("pp2_x_dp2", "pp2_x_tp2", "uneven_pp2_x_dp2"):
        assert {"sampler_by_global_rank", "pipeline_loss_not_scaled"} <= ran[name], name
    assert "tensor_peers_see_different_data" in ran["pp2_x_tp2"]
    # A control that only scales the plan's losses, by the same factor on every replica, is the
    # plan's own gradient (from the real step) times that factor and takes no pass: not
    # dividing by the accumulation steps, summing the losses (the plan weighs every sample
    # alike, even on uneven replicas, and so does a sum), the schedule not dividing by its
    # micro-batches. Averaging uneven replicas' means alike (unweighted_mean) scales each
    # replica by another factor, and takes its pass.
    scaled = {"accumulation_not_divided", "sum_without_scaling", "pipeline_loss_not_scaled"}
    for name in CASES:
        assert passed[name] == [len(ran[name] - scaled)], (name, passed[name], ran[name])
    assert "unweighted_mean" in ran["uneven_dp2_x_tp2"] and "unweighted_mean" in ran["uneven_pp2_x_dp2"]
