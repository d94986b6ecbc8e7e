"""The `tokens` check on real gloo process groups (warm ranks, and torchrun): a language model
on sequences of uneven valid length, the token-normalised step against the single-process
mean per-token loss at float64, and every token-normalisation mistake detected."""

from __future__ import annotations

import json
import subprocess
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from fastapi.testclient import TestClient
from support.polling import check_result, run_check

from app.contract.rank_command import torchrun_argv
from app.ports import free_port
from app.worker.checks.token_check import TOKEN_CONTROLS, changes_gradient
from app.worker.training.token_model import IGNORE_INDEX, TinyLanguageModel, token_loss, token_sample

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
CONTROLS = ["mean_per_micro_batch", "mean_per_replica", "padding_counted"]
FACTORY = "app.worker.example_models:tiny_language_model"
# 4 replicas x 2 micro-batches of 2 sequences of 16 tokens: 16 sequences, lengths 1 to 16.
TOKEN_PLAN: dict[str, Any] = {
    "topology": {"num_nodes": 1, "gpus_per_node": 4},
    "sequence_length": 16,
    "global_batch_tokens": 256,
    "micro_batch_tokens": 32,
    "loss_normalization": "token",
}


@pytest.fixture
def client(models_worker: TestClient) -> TestClient:
    """tests/worker/conftest.py's app: FACTORY registered as tiny_lm (beside other models)."""
    return models_worker


def test_the_synthetic_batch_has_uneven_lengths_and_padding() -> None:
    lengths = [int((token_sample(i, 0, 16)[1] != IGNORE_INDEX).sum()) for i in range(16)]
    assert len(set(lengths)) > 4 and min(lengths) < 16 and max(lengths) > 1


def test_the_token_normalised_step_passes_and_every_control_is_detected(client: TestClient) -> None:
    job = run_check(client, {"plan": TOKEN_PLAN})  # the plan's token normalisation picks the workload
    result = job["result"]
    assert job["request"]["workload"] == result["workload"] == "tokens"  # said, not left null
    assert result["warnings"] == []
    assert result["model"] == "tokens" and result["processes"] == 4 and result["backend"] == "gloo"
    assert result["gradient_accumulation_steps"] == 2 and result["micro_batch_sizes"] == [2]
    assert result["rel_l2"] <= result["tolerance"] == 1e-10
    assert [c["name"] for c in result["controls"]] == CONTROLS
    assert all(c["detected"] and c["rel_l2"] > 1e-3 for c in result["controls"]), result["controls"]
    assert result["controls_skipped"] == []
    assert result["passed"] and result["sampler_checked"]


def test_sample_normalisation_on_uneven_lengths_is_shown_wrong(client: TestClient) -> None:
    result = check_result(
        client, {"plan": {**TOKEN_PLAN, "loss_normalization": "sample"}, "workload": "tokens"}
    )
    assert not result["passed"] and not result["gradient_matches"]
    by_name = {c["name"]: c for c in result["controls"]}
    # Under sample each micro-batch averages its own tokens: exactly the Transformers bug.
    assert result["rel_l2"] == pytest.approx(by_name["mean_per_micro_batch"]["rel_l2"], rel=1e-9)


def test_a_registered_token_model_passes(client: TestClient) -> None:
    result = check_result(client, {"plan": TOKEN_PLAN, "model": "tiny_lm", "workload": "tokens"})
    assert result["model"] == "tiny_lm" and result["passed"]
    assert [c["name"] for c in result["controls"] if c["detected"]] == CONTROLS


def _refused(client: TestClient, plan: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/checks", json={"plan": plan, "model": "tiny_lm"})
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem: dict[str, Any] = response.json()
    assert [e["pointer"] for e in problem["errors"]] == ["/plan/sequence_length"]
    return problem


def test_a_plan_in_tokens_of_another_sequence_length_than_the_models_is_refused_with_what_works(
    client: TestClient,
) -> None:
    """tiny_lm's sequences have 16 tokens (its probe read them); a plan counted in sequences of
    32 would run other token counts than it says. Each suggestion, substituted, checks."""
    models = {m["name"]: m for m in client.get("/v1/check-models").json()["models"]}
    assert models["tiny_lm"]["sequence_length"] == len(token_sample(0, 0, 16)[0]) == 16
    problem = _refused(client, {**TOKEN_PLAN, "sequence_length": 32})
    assert "the model's sequences have 16 tokens" in problem["detail"]
    assert problem["suggestions"] == {"sequence_length": [16]}
    fixed = check_result(client, {"plan": {**TOKEN_PLAN, "sequence_length": 16}, "model": "tiny_lm"})
    assert fixed["passed"] and fixed["warnings"] == []
    # 192 and 24 tokens are not whole sequences of 16: the same split, counted in the model's.
    odd = {**TOKEN_PLAN, "sequence_length": 24, "global_batch_tokens": 192, "micro_batch_tokens": 24}
    problem = _refused(client, odd)
    assert not problem.get("suggestions")
    (together,) = problem["combined_suggestions"]
    assert together == {"sequence_length": 16, "global_batch_tokens": 128, "micro_batch_tokens": 16}
    job = run_check(client, {"plan": {**odd, **together}, "model": "tiny_lm"})
    assert job["status"] == "succeeded" and job["result"]["passed"], job
    assert job["result"]["global_batch_size"] == 8 and job["result"]["micro_batch_sizes"] == [1]


def test_a_plan_in_samples_of_another_sequence_length_runs_and_warns(client: TestClient) -> None:
    """Counted in samples, the split is the same at any length: the check holds, and says the
    plan's token figures assume 32."""
    plan = {**TOKEN_PLAN, "sequence_length": 32, "global_batch_size": 16, "micro_batch_size": 2}
    del plan["global_batch_tokens"], plan["micro_batch_tokens"]
    result = check_result(client, {"plan": plan, "model": "tiny_lm"})
    assert result["passed"] and result["workload"] == "tokens" and result["micro_batch_sizes"] == [2]
    (warning,) = result["warnings"]
    assert "the model's sequences have 16 tokens, the plan's sequence_length is 32" in warning


def test_under_torchrun_through_the_same_rank_program() -> None:
    request = json.dumps({"plan": {**TOKEN_PLAN, "topology": {"num_nodes": 1, "gpus_per_node": 2}}})
    completed = subprocess.run(
        torchrun_argv(request, nproc_per_node=2, rdzv_endpoint=f"127.0.0.1:{free_port()}"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, completed.stdout  # rank 0 alone prints the result
    result = json.loads(lines[0])
    assert result["passed"] and result["processes"] == 2 and result["model"] == "tokens"
    assert [c["name"] for c in result["controls"] if c["detected"]] == CONTROLS


def test_controls_apply_exactly_where_they_change_the_token_weights() -> None:
    by_name = {c.name: c for c in TOKEN_CONTROLS}
    even = {0: [(5, 8), (5, 8)], 1: [(5, 8), (5, 8)]}  # equal counts, with padding
    assert not changes_gradient(by_name["mean_per_micro_batch"].scale, even)
    assert not changes_gradient(by_name["mean_per_replica"].scale, even)
    assert changes_gradient(by_name["padding_counted"].scale, even)
    full = {0: [(8, 8), (3, 8)], 1: [(6, 8), (5, 8)]}  # replicas equal (11 each), micro-batches not
    assert changes_gradient(by_name["mean_per_micro_batch"].scale, full)
    assert not changes_gradient(by_name["mean_per_replica"].scale, full)
    no_padding = {0: [(8, 8)], 1: [(8, 8)]}
    assert not changes_gradient(by_name["padding_counted"].scale, no_padding)
    assert by_name["mean_per_replica"].scale(0, 1, full) == Fraction(1, 11)


def test_the_token_loss_ignores_padding_as_torch_does() -> None:
    inputs, labels = token_sample(3, 0, 16)
    model = TinyLanguageModel().double()
    logits = model(inputs.unsqueeze(0))
    valid = labels != IGNORE_INDEX
    expected = torch.nn.functional.cross_entropy(logits[0][valid], labels[valid], reduction="sum")
    assert torch.equal(token_loss(logits, labels.unsqueeze(0), "sum"), expected)
    # Causal: the valid positions' logits do not depend on the padding after them.
    padded = inputs.clone()
    padded[~valid] = 7
    assert torch.equal(model(padded.unsqueeze(0))[0][valid], logits[0][valid])


def test_what_the_tokens_workload_does_not_measure_is_refused(client: TestClient) -> None:
    for extra, pointer in (
        ({"fit_micro_batch": {"memory_bytes": 1 << 30}}, "/fit_micro_batch"),
        ({"noise_scale": {"steps": 4}}, "/noise_scale/steps"),
        ({"workload": "text"}, "/workload"),
    ):
        response = client.post("/v1/checks", json={"plan": TOKEN_PLAN, **extra})
        assert response.status_code == 422, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.json()["errors"][0]["pointer"] == pointer
