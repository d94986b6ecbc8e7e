"""Plans from measured throughput curves over HTTP (issue 38): what the answer states, and each
bad curve a 422 at its field (JSON pointer) with what works. The split itself is held against
exhaustive search in tests/core/test_curve_split_properties.py."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.bodies import put
from support.problems import assert_field_error, assert_wrong_plan, post_raw

from app.schemas.examples import plan_example

MIXED = plan_example("mixed_curves")  # 16 H100 and 4 A100 replicas, each group its measured curve


def _curve(*points: tuple[int, float]) -> list[dict[str, Any]]:
    return [{"micro_batch_size": b, "samples_per_s": r} for b, r in points]


# One replica kind whose samples/s peaks at micro-batch 32 and falls after it (memory pressure).
PEAKED = {
    "topology": {
        "num_nodes": 1,
        "gpus_per_node": 8,
        "throughput_curve": _curve((16, 2000.0), (32, 2600.0), (64, 2200.0)),
    },
    "global_batch_size": 512,
    "max_micro_batch_size": 64,
}


def test_a_mixed_plan_from_curves_states_its_predicted_times(client: TestClient) -> None:
    response = client.post("/v1/plans", json=MIXED)
    assert response.status_code == 200, response.text
    plan = response.json()
    t = plan["throughput"]
    groups = plan["replica_groups"]
    # The global batch exactly, each group's own micro-batch, each with its predicted micro-step.
    assert (
        sum((g["stop"] - g["start"]) * g["micro_batch_size"] for g in groups)
        * plan["gradient_accumulation_steps"]
        == MIXED["global_batch_size"]
        == plan["global_batch_size"]
    )
    assert all(isinstance(g["predicted_micro_step_s"], float) for g in groups)
    assert t["predicted_micro_step_s"] == max(g["predicted_micro_step_s"] for g in groups)
    assert t["predicted_step_s"] == pytest.approx(
        plan["gradient_accumulation_steps"] * t["predicted_micro_step_s"]
    )
    # Beside the splits it was chosen over: no slower than the even one or one by scalar rates.
    assert t["predicted_step_s"] < t["proportional"]["predicted_step_s"] < t["even"]["predicted_step_s"]
    assert t["idle_fraction"] < t["proportional"]["idle_fraction"] < t["even"]["idle_fraction"]
    assert t["extrapolated"] is False
    # The explanation says why, in the answer's own numbers.
    why = " ".join(plan["explanation"])
    assert "planned from the measured throughput curves" in why
    assert f"{t['predicted_micro_step_s']:.4g} s" in why and f"{t['even']['predicted_step_s']:.4g} s" in why
    assert f"{t['proportional']['predicted_step_s']:.4g} s" in why


def test_without_curves_the_plan_has_no_throughput(client: TestClient) -> None:
    plan = client.post("/v1/plans", json=plan_example("mixed")).json()
    assert plan["throughput"] is None
    assert all(g["predicted_micro_step_s"] is None for g in plan["replica_groups"])


def test_the_fastest_micro_batch_not_the_largest_that_fits(client: TestClient) -> None:
    plan = client.post("/v1/plans", json=PEAKED).json()
    t = plan["throughput"]
    # 64 a replica fits (accumulation 1), but 32 runs 2600 samples/s against 2200: 2 x 32.
    assert (plan["micro_batch_size"], plan["gradient_accumulation_steps"]) == (32, 2)
    assert t["fewest_accumulation"]["gradient_accumulation_steps"] == 1
    assert t["predicted_step_s"] < t["fewest_accumulation"]["predicted_step_s"]
    why = " ".join(plan["explanation"])
    assert "not taken as the largest that fits" in why
    assert f"accumulation {t['fewest_accumulation']['gradient_accumulation_steps']})" in why
    # Without the curve the same request takes the largest micro-batch that fits.
    bare = copy.deepcopy(PEAKED)
    del bare["topology"]["throughput_curve"]
    assert client.post("/v1/plans", json=bare).json()["micro_batch_size"] == 64


def test_a_micro_batch_past_the_measured_points_is_warned_about(client: TestClient) -> None:
    body = put(PEAKED, "topology.throughput_curve", _curve((4, 500.0), (8, 900.0)))
    plan = client.post("/v1/plans", json=body).json()
    assert plan["throughput"]["extrapolated"] is True
    assert any("past the largest measured point" in w for w in plan["warnings"]), plan["warnings"]


def _group_curve(index: int) -> str:
    return f"topology.node_groups.{index}.throughput_curve"


# (request, the pointer at fault, a word of what works in the detail)
WRONG = [
    (
        put(MIXED, _group_curve(0), _curve((8, 960.0), (32, 2600.0), (16, 1840.0))),
        "/topology/node_groups/0/throughput_curve/2/micro_batch_size",
        "strictly increase",
    ),
    (
        put(MIXED, _group_curve(0), _curve((8, 960.0), (8, 990.0))),
        "/topology/node_groups/0/throughput_curve/1/micro_batch_size",
        "strictly increase",
    ),
    (
        put(MIXED, _group_curve(1), _curve((8, 520.0), (64, 1100.0))),  # the a100 cap is 32
        "/topology/node_groups/1/throughput_curve/1/micro_batch_size",
        "raise the cap to 64",
    ),
    (
        put(MIXED, f"{_group_curve(1)}.1.samples_per_s", 0),
        "/topology/node_groups/1/throughput_curve/1/samples_per_s",
        "greater than or equal to 0.000001",
    ),
    (
        put(MIXED, f"{_group_curve(1)}.1.samples_per_s", -3.5),
        "/topology/node_groups/1/throughput_curve/1/samples_per_s",
        "greater than or equal to 0.000001",
    ),
    (
        put(MIXED, _group_curve(1), None),  # a group without a curve beside one with
        "/topology/node_groups/1/throughput_curve",
        "throughput_curve too",
    ),
    (
        put(put(MIXED, _group_curve(1), None), "topology.node_groups.1.relative_throughput", 0.4),
        "/topology/node_groups/1/relative_throughput",
        "throughput_curve too",
    ),
    (
        put(MIXED, "topology.node_groups.0.relative_throughput", 2.0),  # both on one group
        "/topology/node_groups/0/relative_throughput",
        "leave relative_throughput out",
    ),
    (
        {**PEAKED, "max_micro_batch_size": 32},  # the request's cap, on a homogeneous cluster
        "/topology/throughput_curve/2/micro_batch_size",
        "raise the cap to 64",
    ),
    (put(PEAKED, "topology.throughput_curve", []), "/topology/throughput_curve", "at least 1"),
]


@pytest.mark.parametrize(("body", "pointer", "works"), WRONG, ids=[w[1] + ":" + w[2] for w in WRONG])
def test_a_bad_curve_is_a_422_at_its_field_with_what_works(
    client: TestClient, body: dict[str, Any], pointer: str, works: str
) -> None:
    assert_wrong_plan(client, body, pointer, works)


def test_nan_samples_per_s_is_a_422_at_its_field(client: TestClient) -> None:
    text = json.dumps(MIXED).replace("880.0", "NaN", 1)
    problem = assert_field_error(
        post_raw(client, text), "/topology/node_groups/1/throughput_curve/1/samples_per_s"
    )
    assert "finite" in problem["errors"][0]["detail"]


def test_a_curve_beside_node_groups_is_refused(client: TestClient) -> None:
    body = put(MIXED, "topology.throughput_curve", _curve((8, 1.0)))
    problem = assert_field_error(client.post("/v1/plans", json=body), "/topology")
    assert "give each group its own throughput_curve" in problem["errors"][0]["detail"]
