"""POST /v1/plans with `recommend` (docs/recommend.md): the law's batch and lr where the request
leaves them out, the request's kept where it gives them with the law's beside them, the
warnings, a measured noise scale beside the law's batch (given, or a finished check named by
id and looked up in the check store), every export carrying the law's numbers, and each bad
input a 422 at its field."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.apps import runner_client, succeeded
from support.bodies import put
from support.fake_runner import FakeRunner
from support.problems import assert_field_error

from app.contract.check_result import CheckResult
from app.main import create_app
from app.schemas.examples import plan_example
from app.settings import Settings
from app.worker.service.runner import CheckOrder

LAW = plan_example("scaling_law")  # 32 GPUs, sequences of 2048, Step Law's 1B shape on 100B tokens
DEEPSEEK = {
    "topology": {"num_nodes": 4, "gpus_per_node": 8},
    "sequence_length": 4096,
    "recommend": {"law": "deepseek", "train_tokens": 10**11, "flops_per_token": 45097156608},
}


@pytest.fixture(scope="module")
def planner() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(worker_enabled=False, log_level="warning"))) as client:
        yield client


def _plan(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_without_batch_or_lr_the_plan_runs_the_laws_snapped_batch_and_its_recipe(planner: TestClient) -> None:
    plan = _plan(planner, LAW)
    rec = plan["recommendation"]
    assert rec["non_embedding_params"] == 1073741824 and rec["model"]["counted_from"] == "architecture"
    assert rec["within_fit"] is True and rec["batch_from"] == rec["lr_from"] == "law"
    # 540.9 sequences; 32 replicas split 512 or 544: the nearer is 544.
    assert rec["planned_batch_size"] == 544 and rec["planned_batch_tokens"] == 544 * 2048
    assert plan["global_batch_size"] == 544 and plan["requested_global_batch_size"] is None
    assert plan["tokens"]["tokens_per_step"] == rec["planned_batch_tokens"]
    lr = plan["learning_rate"]
    assert lr["lr"] == rec["lr"] and lr["rule"] == "none" and lr["optimizer"] == "adamw"
    assert (lr["decay"], lr["min_lr"]) == ("cosine", 1e-05)
    assert lr["train_steps"] == round(10**11 / (544 * 2048))
    assert rec["explanation"] in plan["explanation"] and "544 sequences" in rec["explanation"]
    assert [a["law"] for a in rec["alternatives"]] == ["deepseek"] and rec["alternatives"][0]["lr"] > 0
    assert any("Power Lines" in n for n in rec["notes"]) and any("2503.04715" in s for s in rec["sources"])
    assert not [w for w in plan["warnings"] if "fitted" in w or "AdamW" in w]


def test_a_micro_batch_alone_is_kept_and_the_laws_batch_snaps_to_its_multiples(planner: TestClient) -> None:
    plan = _plan(planner, {**LAW, "micro_batch_size": 5})
    assert plan["micro_batch_size"] == 5 and plan["global_batch_size"] % (5 * 32) == 0
    assert plan["global_batch_size"] == 480  # 540.9 lies between 480 and 640


def test_the_requests_batch_and_lr_are_kept_with_the_laws_beside_them(planner: TestClient) -> None:
    body = {
        **LAW,
        "global_batch_tokens": 4096 * 2048,
        "learning_rate": {
            "base_lr": 0.01,
            "rule": "none",
            "optimizer": "sgd",
            "decay": "linear",
            "train_steps": 1000,
        },
    }
    plan = _plan(planner, body)
    rec = plan["recommendation"]
    assert plan["global_batch_size"] == 4096 and plan["requested_global_batch_size"] == 4096
    assert rec["batch_from"] == rec["lr_from"] == "request"
    assert rec["plan_batch_to_law"] == pytest.approx(4096 * 2048 / rec["batch_tokens"])
    assert rec["plan_lr_to_law"] == pytest.approx(plan["learning_rate"]["lr"] / rec["lr"])
    assert rec["planned_batch_tokens"] == 544 * 2048  # still the law's batch, snapped
    warned = " | ".join(plan["warnings"])
    assert "7.57x the law's" in warned and "the nearest batch this cluster splits is 1114112" in warned
    assert "optimizer sgd" in warned and "cosine decay to a fixed min lr of 1e-5" in warned
    assert "peak lr 0.01 is 6.44x the law" in warned


def test_learning_rate_without_base_lr_takes_the_laws_at_the_laws_batch(planner: TestClient) -> None:
    recipe = {
        "optimizer": "adamw",
        "warmup_steps": 100,
        "warmup_start_lr": 0,
        "decay": "cosine",
        "min_lr": 1e-5,
    }
    plan = _plan(
        planner, {**LAW, "global_batch_tokens": 1024 * 2048, "learning_rate": {**recipe, "train_steps": 9000}}
    )
    rec, lr = plan["recommendation"], plan["learning_rate"]
    assert rec["lr_from"] == "law" and rec["batch_from"] == "request"
    # Rule auto means none for the law's lr: the lr is the law's, not scaled to the larger batch.
    assert (
        lr["rule"] == "none"
        and lr["lr"] == rec["lr"]
        and lr["base_batch_tokens"] == round(rec["batch_tokens"])
    )
    scaled = _plan(planner, {**LAW, "learning_rate": {**recipe, "rule": "sqrt", "train_steps": 9000}})
    factor = (544 * 2048 / scaled["recommendation"]["batch_tokens"]) ** 0.5
    assert scaled["learning_rate"]["lr"] == pytest.approx(scaled["recommendation"]["lr"] * factor, rel=1e-6)


def test_deepseeks_recipe_and_the_fitted_range(planner: TestClient) -> None:
    plan = _plan(planner, DEEPSEEK)
    rec, lr = plan["recommendation"], plan["learning_rate"]
    steps = lr["train_steps"]
    assert lr["decay"] == "step" and lr["milestones"] == [-(-8 * steps // 10), -(-9 * steps // 10)]
    assert (
        lr["gamma"] == pytest.approx(0.1**0.5) and lr["warmup_steps"] == 2000 and lr["warmup_start_lr"] == 0
    )
    assert lr["betas"] == [0.9, 0.95] and lr["weight_decay"] == 0.1 and lr["max_grad_norm"] == 1.0
    assert rec["compute"] == pytest.approx(45097156608 * 10**11) and rec["within_fit"] is False
    [fit] = rec["fitted_ranges"]
    assert fit["quantity"] == "compute" and fit["factor_outside"] == pytest.approx(rec["compute"] / 2e19)
    assert any("225x above" in w and "extrapolation" in w for w in plan["warnings"])
    assert rec["alternatives"] == [
        {
            "law": "step_law",
            "batch_tokens": None,
            "lr": None,
            "within_fit": None,
            "unavailable": "it needs non_embedding_params",
        }
    ]


def test_a_measured_noise_scale_is_put_beside_the_laws_batch(planner: TestClient) -> None:
    small = _plan(planner, put(LAW, "recommend.measured_noise_scale", 100))["recommendation"]["measured"]
    assert small["critical_batch_tokens"] == 204800 and small["larger"] == "law"
    warned = _plan(planner, put(LAW, "recommend.measured_noise_scale", 100))["warnings"]
    assert any("measured critical batch" in w for w in warned)
    large = _plan(planner, {**LAW, "gradient_noise_scale": 4096})["recommendation"]["measured"]
    assert large["larger"] == "measured" and large["source"] == "gradient_noise_scale"
    assert large["measured_to_law"] == pytest.approx(4096 * 2048 / 1107714.88996, rel=1e-6)


def test_every_export_carries_the_laws_batch_and_lr(planner: TestClient) -> None:
    for fmt in ("torchrun", "python", "megatron", "hf-trainer"):
        response = planner.post(f"/v1/plans/export/{fmt}", json=LAW)
        assert response.status_code == 200, (fmt, response.text)
        text = response.text
        assert "from the step_law scaling law" in text and "1114112 tokens (544 sequences" in text, fmt
    torchrun = planner.post("/v1/plans/export/torchrun", json=LAW).text
    assert "GLOBAL_BATCH_SIZE=544" in torchrun
    config = json.loads(planner.post("/v1/plans/export/deepspeed", json=LAW).text)
    assert config["train_batch_size"] == 544 and "step_law" in config["batchplan_note"]


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("change", "pointer"),
    [
        ({"recommend.train_tokens": 0}, "/recommend/train_tokens"),
        ({"recommend.architecture.layers": -3}, "/recommend/architecture/layers"),
        ({"recommend.architecture.num_kv_heads": 0}, "/recommend/architecture/num_kv_heads"),
        ({"recommend.law": "chinchilla"}, "/recommend/law"),
        ({"recommend.architecture": None}, "/recommend/non_embedding_params"),
        ({"recommend.non_embedding_params": 10**9}, "/recommend/architecture"),
        ({"sequence_length": None}, "/sequence_length"),
        ({"learning_rate": {"base_batch_tokens": 1048576}}, "/learning_rate/base_batch_tokens"),
    ],
)
def test_bad_input_is_a_422_at_its_field(planner: TestClient, change: dict[str, Any], pointer: str) -> None:
    body = copy.deepcopy(LAW)
    for key, value in change.items():
        body = put(body, key, value)
    body = {k: v for k, v in body.items() if v is not None}
    assert_field_error(planner.post("/v1/plans", json=body), pointer)


def test_heads_that_do_not_divide_are_refused_with_the_heads_that_do(planner: TestClient) -> None:
    problem = assert_field_error(
        planner.post("/v1/plans", json=put(LAW, "recommend.architecture.num_heads", 12)),
        "/recommend/architecture/num_heads",
    )
    assert problem["suggestions"] == {"recommend.architecture.num_heads": [8, 16, 4, 32]}
    kv = put(LAW, "recommend.architecture.num_kv_heads", 3)
    problem = assert_field_error(planner.post("/v1/plans", json=kv), "/recommend/architecture/num_kv_heads")
    assert problem["suggestions"] == {"recommend.architecture.num_kv_heads": [2, 4, 1, 8]}


def test_a_law_without_what_it_needs_is_refused_at_that_field(planner: TestClient) -> None:
    deepseek = {
        **DEEPSEEK,
        "recommend": {"law": "deepseek", "train_tokens": 10**11, "non_embedding_params": 10**9},
    }
    problem = assert_field_error(planner.post("/v1/plans", json=deepseek), "/recommend/flops_per_token")
    assert "not 6N" in problem["detail"]
    step = {**DEEPSEEK, "recommend": {"law": "step_law", "train_tokens": 10**11, "flops_per_token": 1e10}}
    assert_field_error(planner.post("/v1/plans", json=step), "/recommend/non_embedding_params")


def test_base_lr_is_still_required_without_recommend(planner: TestClient) -> None:
    body = {"topology": {"num_nodes": 1, "gpus_per_node": 8}, "global_batch_size": 64, "learning_rate": {}}
    assert_field_error(planner.post("/v1/plans", json=body), "/learning_rate/base_lr")
    body["learning_rate"] = {"rule": "linear"}
    assert_field_error(planner.post("/v1/plans", json=body), "/learning_rate/base_lr")


# ----------------------------------------------------------------------------- a check named by id


@dataclasses.dataclass(frozen=True)
class ProbeResult(CheckResult):
    """A check result with a hand-written lr-scaling probe's answer (only its noise scale)."""

    lr_scaling: dict[str, Any] | None = None  # type: ignore[assignment]


class NoiseRunner(FakeRunner):
    """While `noise` is set, a check answers with it as the result's noise_scale; while `probe`
    is, as an lr-scaling probe whose noise_scale it is."""

    noise: dict[str, Any] | None = None
    probe: dict[str, Any] | None = None

    async def run_check(self, order: CheckOrder) -> CheckResult:
        result = await super().run_check(order)
        if self.probe is not None:
            fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(CheckResult)}
            return ProbeResult(**{**fields, "lr_scaling": {"noise_scale": self.probe}})
        return result if self.noise is None else dataclasses.replace(result, noise_scale=self.noise)


@pytest.fixture
def checks(tmp_path: Path) -> Iterator[tuple[TestClient, NoiseRunner]]:
    runner = NoiseRunner()
    for client in runner_client(tmp_path, runner):
        yield client, runner


def _check_id(
    client: TestClient, runner: NoiseRunner, noise: dict[str, Any] | None, probe: dict[str, Any] | None = None
) -> str:
    runner.noise, runner.probe = noise, probe
    try:
        body = {"plan": {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}}
        return str(succeeded(client, body)["id"])
    finally:
        runner.noise = runner.probe = None


def test_a_finished_noise_scale_check_named_by_id_is_looked_up(
    checks: tuple[TestClient, NoiseRunner],
) -> None:
    client, runner = checks
    reliable = _check_id(client, runner, {"b_simple": 700.0, "critical_batch_size": 700.0, "reliable": True})
    plan = _plan(client, put(LAW, "recommend.noise_scale_check", reliable))
    measured = plan["recommendation"]["measured"]
    assert measured["noise_scale"] == 700.0 and measured["critical_batch_tokens"] == 700 * 2048
    assert measured["source"] == f"check {reliable}" and measured["larger"] == "measured"
    unreliable = _check_id(
        client,
        runner,
        {"b_simple": 5.0, "critical_batch_size": None, "unreliable_because": ["too few steps"]},
    )
    problem = assert_field_error(
        client.post("/v1/plans", json=put(LAW, "recommend.noise_scale_check", unreliable)),
        "/recommend/noise_scale_check",
    )
    assert "too few steps" in problem["detail"]
    plain = _check_id(client, runner, None)
    assert_field_error(
        client.post("/v1/plans", json=put(LAW, "recommend.noise_scale_check", plain)),
        "/recommend/noise_scale_check",
    )
    assert_field_error(
        client.post("/v1/plans", json=put(LAW, "recommend.noise_scale_check", "nosuchcheck")),
        "/recommend/noise_scale_check",
    )
    # An lr-scaling probe: B_simple at the end of its base run, else at its start.
    probe = _check_id(client, runner, None, probe={"start": 40.0, "end": 90.0})
    measured = _plan(client, put(LAW, "recommend.noise_scale_check", probe))["recommendation"]["measured"]
    assert measured["noise_scale"] == 90.0 and measured["larger"] == "law"
    both = put(put(LAW, "recommend.noise_scale_check", probe), "recommend.measured_noise_scale", 5)
    assert_field_error(client.post("/v1/plans", json=both), "/recommend/noise_scale_check")


def test_a_check_of_a_recommended_plan_trains_the_laws_batch_and_recipe(
    checks: tuple[TestClient, NoiseRunner],
) -> None:
    client, runner = checks
    plan = {
        "topology": {"num_nodes": 1, "gpus_per_node": 2},
        "sequence_length": 64,
        "recommend": {"law": "step_law", "non_embedding_params": 10**6, "train_tokens": 10**6},
    }
    expected = _plan(client, plan)
    job = succeeded(client, {"plan": plan, "steps": 2})
    spec = runner.orders[-1].spec
    assert job["status"] == "succeeded" and spec.global_batch_size == expected["global_batch_size"]
    assert spec.run_plan is not None and spec.run_plan.learning_rate is not None
    assert spec.run_plan.learning_rate.lr == expected["recommendation"]["lr"]
    assert spec.run_plan.global_batch_size == expected["global_batch_size"]
