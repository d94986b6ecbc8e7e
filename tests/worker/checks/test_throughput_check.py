"""The throughput measurement (issue 38) on real warm gloo ranks (the session's default server,
tests/conftest.py): the points come in order with the fastest and the knee read off them, the
curve plans as POST /v1/plans takes it, the chart draws it, and a token plan counts tokens."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from fastapi.testclient import TestClient
from support.polling import run_check

pytestmark = pytest.mark.slow

TWO = {"num_nodes": 1, "gpus_per_node": 2}
FAST = {"repeats": 3, "warmup_steps": 1}


@pytest.fixture
def client(default_worker: TestClient) -> TestClient:
    return default_worker


def measured(client: TestClient, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    job = run_check(client, body, timeout=120)
    assert job["status"] == "succeeded", job
    return job["id"], job["result"]


def consistent(throughput: dict[str, Any], sizes: list[int]) -> None:
    points = throughput["points"]
    assert [p["micro_batch_size"] for p in points] == sizes
    rates = {p["micro_batch_size"]: p["samples_per_s"] for p in points}
    for p in points:
        assert p["step_time_s"] > 0 and p["spread"] >= 0 and p["micro_steps_per_repeat"] >= 1
        assert p["samples_per_s"] == pytest.approx(p["micro_batch_size"] / p["step_time_s"], rel=1e-5)
        # CPU reports no peak; a GPU's caching allocator does.
        assert (p["peak_memory_bytes"] is None) == (throughput["device"] == "cpu")
    fastest = throughput["fastest_micro_batch_size"]
    assert rates[fastest] == max(rates.values())
    knee = throughput["knee_micro_batch_size"]
    floor = (1 - throughput["margin"]) * rates[fastest]
    assert knee <= fastest and rates[knee] >= floor
    assert all(rates[b] < floor for b in sizes if b < knee)
    assert throughput["curve"] == [{"micro_batch_size": b, "samples_per_s": rates[b]} for b in sizes]
    assert throughput["measured_by"].startswith("rank 0 alone")


def test_the_built_in_models_curve_is_ordered_plans_and_draws(client: TestClient) -> None:
    sizes = [1, 2, 4, 8, 16, 32]
    body = {
        "plan": {"topology": TWO, "global_batch_size": 16},
        "throughput": {"micro_batch_sizes": sizes, **FAST},
    }
    _, result = measured(client, body)
    assert result["passed"]  # the check itself ran as without the measurement
    throughput = result["throughput"]
    consistent(throughput, sizes)
    assert all(p["tokens_per_s"] is None for p in throughput["points"])
    assert {"throughput"} <= set(result["timings_s"])
    # The curve is the request form of topology.throughput_curve: fed back, it plans.
    plan = client.post(
        "/v1/plans",
        json={
            "topology": {**TWO, "throughput_curve": throughput["curve"]},
            "global_batch_size": 64,
            "max_micro_batch_size": 32,
        },
    )
    assert plan.status_code == 200, plan.text
    assert plan.json()["throughput"]["predicted_step_s"] > 0
    # And a mixed cluster of two measured groups plans from the two curves.
    mixed = client.post(
        "/v1/plans",
        json={
            "topology": {
                "node_groups": [
                    {
                        "name": "a",
                        "num_nodes": 1,
                        "gpus_per_node": 1,
                        "throughput_curve": throughput["curve"],
                    },
                    {
                        "name": "b",
                        "num_nodes": 1,
                        "gpus_per_node": 1,
                        "throughput_curve": throughput["curve"][:4],
                    },
                ]
            },
            "global_batch_size": 40,
            "max_micro_batch_size": 32,
        },
    )
    assert mixed.status_code == 200, mixed.text


def test_the_chart_of_a_measured_check_is_png_and_svg(client: TestClient) -> None:
    body = {
        "plan": {"topology": TWO, "global_batch_size": 8},
        "throughput": {"micro_batch_sizes": [2, 4], **FAST},
    }
    check_id, _ = measured(client, body)
    png = client.get(f"/v1/checks/{check_id}/throughput.png")
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG\r\n\x1a\n")
    svg = client.get(f"/v1/checks/{check_id}/throughput.svg")
    assert svg.headers["content-type"] == "image/svg+xml" and b"knee" in svg.content


def test_a_token_plan_counts_tokens_and_default_sizes_go_up_to_the_cap(client: TestClient) -> None:
    plan = {
        "topology": TWO,
        "global_batch_size": 8,
        "sequence_length": 16,
        "loss_normalization": "token",
        "max_micro_batch_size": 6,
    }
    _, result = measured(client, {"plan": plan, "throughput": FAST})
    throughput = result["throughput"]
    consistent(throughput, [1, 2, 4, 6])
    assert result["workload"] == "tokens"
    for p in throughput["points"]:
        assert p["tokens_per_s"] == pytest.approx(p["samples_per_s"] * 16, rel=1e-5)


def test_a_registered_model_is_measured_with_the_optimizer_step(client: TestClient) -> None:
    body = {
        "plan": {"topology": TWO, "global_batch_size": 8},
        "model": "mlp",
        "noise_scale": {"steps": 0},
        "throughput": {"micro_batch_sizes": [1, 4], "time_optimizer_step": True, **FAST},
    }
    _, result = measured(client, body)
    consistent(result["throughput"], [1, 4])
    assert result["throughput"]["time_optimizer_step"] is True and result["model"] == "mlp"


def test_after_a_micro_batch_search_the_default_sizes_go_up_to_what_fits(client: TestClient) -> None:
    body = {
        "plan": {"topology": TWO, "global_batch_size": 16},
        "model": "mlp",
        "noise_scale": {"steps": 0},
        "fit_micro_batch": {"memory_bytes": 1 << 30},
        "throughput": FAST,
    }
    _, result = measured(client, body)
    found = result["micro_batch_search"]["max_micro_batch_size"]
    assert found == 8  # a replica's whole share of the step: the search's own limit
    consistent(result["throughput"], [1, 2, 4, 8])
