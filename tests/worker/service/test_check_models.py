"""Operator-registered check models over HTTP, with real gloo process groups on warm ranks:
DDP-equivalence findings, the gradient noise scale against a closed form, and the
micro-batch search feeding a re-plan."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from fastapi.testclient import TestClient
from support.polling import check_result
from support.registered_models import BROKEN, EXAMPLES

from app.worker.measure.memory import probe
from app.worker.training.synthetic_model import build_model
from app.worker.training.workload import Registered
from app.worker.zoo import example_models

pytestmark = pytest.mark.slow

FOUR = {"topology": {"num_nodes": 1, "gpus_per_node": 4}, "global_batch_size": 64, "micro_batch_size": 8}


@pytest.fixture
def client(models_worker: TestClient) -> TestClient:
    """tests/worker/conftest.py's app: the example models and the BROKEN entries registered
    (with the token checks' model beside them)."""
    return models_worker


def problem(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/checks", json=body)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    out: dict[str, Any] = response.json()
    return out


def causes(result: dict[str, Any]) -> set[str]:
    return {f["cause"] for f in result["ddp_equivalence"]["findings"] if f["breaks_equivalence"]}


def test_models_are_listed_with_what_their_factory_built(client: TestClient) -> None:
    models = {m["name"]: m for m in client.get("/v1/check-models").json()["models"]}
    assert models["synthetic"]["default"] is True
    synthetic = build_model(0, torch.float64, torch.device("cpu"))
    assert models["synthetic"]["parameters"] == sum(p.numel() for p in synthetic.parameters())
    assert models["mlp"]["loaded"] is True
    assert models["mlp"]["dataset_size"] == example_models.SAMPLES
    assert models["mlp"]["parameters"] == sum(p.numel() for p in example_models.mlp()[0].parameters())
    assert models["quadratic"]["description"].startswith("Gaussian samples")
    assert models["missing"]["loaded"] is False and "cannot import" in models["missing"]["error"]
    assert {n: m["status"] for n, m in models.items() if not m["loaded"]} == dict.fromkeys(BROKEN, "failed")
    assert all(m["status"] == "loaded" and m["status_detail"] is None for m in models.values() if m["loaded"])
    assert models["mlp"]["sequence_length"] is None  # features, not token ids
    assert models["not_callable"]["loaded"] is False and "not callable" in models["not_callable"]["error"]
    assert "(model, dataset, loss_fn)" in models["wrong_return"]["error"]
    # The API names models; it never shows where their code lives.
    assert "app.worker" not in str(models["mlp"])


def test_a_clean_model_is_ddp_equivalent_and_measures_its_noise_scale(client: TestClient) -> None:
    result = check_result(client, {"plan": FOUR, "model": "mlp"})
    assert result["model"] == "mlp"
    assert result["passed"] and result["gradient_matches"]
    assert result["ddp_equivalence"]["equivalent"] is True
    assert result["ddp_equivalence"]["findings"] == []
    noise = result["noise_scale"]
    assert noise["steps"] == 8 and noise["small_batch_is"] == "replica"
    assert noise["small_batch"] == 16 and noise["big_batch"] == 64
    assert noise["b_simple"] > 0 and noise["stderr"] > 0
    assert len(noise["history"]) == 8 and noise["history"][-1]["b_simple"] == noise["b_simple"]
    assert "critical batch" in noise["recommendation"]


@pytest.mark.parametrize(
    ("model", "cause", "gradient_matches"),
    [
        ("batchnorm_mlp", "batch_norm", False),
        ("dropout_mlp", "dropout", False),
        ("rank_dependent_mlp", "rank_dependent", False),
    ],
)
def test_each_known_cause_is_found_and_explained(
    client: TestClient, model: str, cause: str, gradient_matches: bool
) -> None:
    result = check_result(client, {"plan": FOUR, "model": model, "noise_scale": {"steps": 0}})
    assert result["gradient_matches"] is gradient_matches
    assert result["ddp_equivalence"]["equivalent"] is False
    assert result["passed"] is False
    assert causes(result) == {cause}
    assert cause.replace("_", " ") in result["ddp_equivalence"]["summary"]
    finding = next(f for f in result["ddp_equivalence"]["findings"] if f["cause"] == cause)
    assert finding["fix"] and finding["detail"]
    if cause == "batch_norm":
        assert finding["modules"] == ["1"]
    assert result["noise_scale"] is None


def test_unused_parameters_keep_the_gradient_and_fail_ddp_defaults(client: TestClient) -> None:
    """The gradient matches (the check used find_unused_parameters=True), so the split is
    equivalent; what fails is DDP's default, at the next step: a separate flag."""
    result = check_result(
        client, {"plan": FOUR, "model": "unused_parameter_mlp", "noise_scale": {"steps": 0}}
    )
    equivalence = result["ddp_equivalence"]
    assert result["gradient_matches"] and equivalence["equivalent"] and result["passed"]
    [finding] = [f for f in equivalence["findings"] if f["cause"] == "unused_parameters"]
    assert finding["modules"] == ["auxiliary_head.weight", "auxiliary_head.bias"]
    assert finding["breaks_equivalence"] is False and finding["fails_with_ddp_defaults"] is True
    assert equivalence["fails_with_ddp_defaults"] is True
    assert "fails at the next step" in equivalence["summary"]


def test_batch_norm_is_equivalent_when_one_micro_batch_is_the_whole_batch(client: TestClient) -> None:
    one = {"topology": {"num_nodes": 1, "gpus_per_node": 1}, "global_batch_size": 32}
    result = check_result(client, {"plan": one, "model": "batchnorm_mlp"})
    assert result["gradient_matches"] and result["ddp_equivalence"]["equivalent"]
    [finding] = [f for f in result["ddp_equivalence"]["findings"] if f["cause"] == "batch_norm"]
    assert finding["breaks_equivalence"] is False
    # One replica, one micro-batch: no small batch to compare, so no default measurement.
    assert result["noise_scale"] is None


def test_the_noise_scale_matches_its_closed_form(client: TestClient) -> None:
    """quadratic: per-sample loss 0.5|theta - x|^2, so B_simple = tr(cov x) / |theta - mean x|^2."""
    data = example_models.quadratic_data(0)
    truth = example_models.quadratic_noise_scale(data, torch.zeros(example_models.QUADRATIC_DIM))
    assert truth == pytest.approx(example_models.QUADRATIC_NOISE_SCALE, rel=0.02)
    plan = {"topology": {"num_nodes": 1, "gpus_per_node": 4}, "global_batch_size": 128}
    result = check_result(client, {"plan": plan, "model": "quadratic", "noise_scale": {"steps": 32}})
    noise = result["noise_scale"]
    assert noise["steps"] == 32
    assert abs(noise["b_simple"] - truth) < 4 * noise["stderr"], noise
    assert noise["b_simple"] == pytest.approx(truth, rel=0.35)
    assert noise["relative_stderr"] < 0.35
    assert noise["efficiency"]["verdict"] == "above_critical"  # 128 is 4x the noise scale
    assert noise["efficiency"]["steps_vs_min"] == pytest.approx(1 + noise["b_simple"] / 128)


def test_one_replica_measures_across_its_accumulation_steps(client: TestClient) -> None:
    plan = {
        "topology": {"num_nodes": 1, "gpus_per_node": 1},
        "global_batch_size": 128,
        "micro_batch_size": 32,
    }
    result = check_result(client, {"plan": plan, "model": "quadratic", "noise_scale": {"steps": 16}})
    noise = result["noise_scale"]
    assert noise["small_batch_is"] == "micro_batch" and noise["small_batch"] == 32
    assert noise["b_simple"] > 0


def test_the_micro_batch_search_replans_through_accumulation(client: TestClient) -> None:
    plan = {"topology": {"num_nodes": 1, "gpus_per_node": 4}, "global_batch_size": 512}
    memory = 4 << 20
    result = check_result(
        client,
        {
            "plan": plan,
            "model": "wide_mlp",
            "noise_scale": {"steps": 0},
            "fit_micro_batch": {"memory_bytes": memory},
        },
    )
    search = result["micro_batch_search"]
    found, planned = search["max_micro_batch_size"], search["planned"]
    assert search["requested"] == {"micro_batch_sizes": [128], "gradient_accumulation_steps": 1}
    assert 1 <= found < 128 and not search["hit_limit"]
    # No margin given: on CPU the default is 0.15 (the storage count misses kernel scratch space).
    assert search["safety_margin"] == 0.15 and search["budget_bytes"] == int(memory * 0.85)
    # The global batch is kept; accumulation grows instead.
    [micro] = planned["micro_batch_sizes"]
    assert planned["global_batch_size"] == 512 and micro <= found
    assert micro * planned["gradient_accumulation_steps"] * 4 == 512
    assert result["micro_batch_sizes"] == [micro] and result["gradient_accumulation_steps"] > 1
    assert result["passed"]
    # The found size is the boundary: it fits the budget and one more does not.
    workload = Registered("wide_mlp", f"{EXAMPLES}:wide_mlp")
    cpu = torch.device("cpu")
    model = workload.module(None, cpu)
    at, _ = probe(model, workload.dataset, workload.loss_fn, found, cpu)
    above, _ = probe(model, workload.dataset, workload.loss_fn, found + 1, cpu)
    assert at <= search["budget_bytes"] < above
    # The re-planned request plans the same split on the planner.
    again = client.post("/v1/plans", json=planned["plan_request"]).json()
    assert again["micro_batch_size"] == micro
    assert again["gradient_accumulation_steps"] == planned["gradient_accumulation_steps"]


def test_requests_name_models_and_get_422s_that_say_what_to_change(client: TestClient) -> None:
    near = problem(client, {"plan": FOUR, "model": "mpl"})
    assert near["errors"][0]["pointer"] == "/model" and "did you mean 'mlp'" in near["detail"]
    path = problem(client, {"plan": FOUR, "model": "app.worker.example_models:mlp"})
    assert path["errors"][0]["pointer"] == "/model"
    broken = problem(client, {"plan": FOUR, "model": "missing"})
    assert "cannot be built" in broken["detail"] and broken["errors"][0]["pointer"] == "/model"
    big = {"topology": {"num_nodes": 1, "gpus_per_node": 4}, "global_batch_size": 8192}
    small = problem(client, {"plan": big, "model": "mlp"})
    assert small["errors"][0]["pointer"] == "/plan/global_batch_size"
    assert str(example_models.SAMPLES) in small["detail"]
    one = {"topology": {"num_nodes": 1, "gpus_per_node": 1}, "global_batch_size": 32}
    steps = problem(client, {"plan": one, "model": "mlp", "noise_scale": {"steps": 4}})
    assert steps["errors"][0]["pointer"] == "/noise_scale/steps"
    cpu = problem(client, {"plan": FOUR, "model": "mlp", "fit_micro_batch": {}})
    assert cpu["errors"][0]["pointer"] == "/fit_micro_batch/memory_bytes"
    for bad in ({"steps": -1}, {"steps": 1000}, {"learning_rate": -1}, {"nope": 1}):
        assert problem(client, {"plan": FOUR, "model": "mlp", "noise_scale": bad})["errors"]
    for bad_fit in ({"memory_bytes": 10}, {"safety_margin": 1}, {"optimizer": "lion"}):
        assert problem(client, {"plan": FOUR, "fit_micro_batch": bad_fit})["errors"]


def test_the_synthetic_default_is_unchanged(client: TestClient) -> None:
    result = check_result(client, {"plan": FOUR})
    assert result["model"] == "synthetic" and result["passed"]
    assert result["ddp_equivalence"]["equivalent"] and result["noise_scale"] is None
    assert result["micro_batch_search"] is None
