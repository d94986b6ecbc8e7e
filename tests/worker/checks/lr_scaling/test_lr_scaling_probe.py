"""The lr-scaling probe (issue 39) on real warm gloo ranks (the shared default worker): its
result's shape is what a plan reads back (by id and by its numbers), seeded reruns give the
same curves bit for bit in float64, its chart is drawn, and bad input is a 422 at its field.
The pure parts (the runs' share of the ranks, the verdict) are tested without ranks."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.polling import check_result, run_check
from support.problems import assert_field_error

from app.contract.kinds.lr_scaling import LrScalingOptions, LrScalingSpec, ProbeRunSpec
from app.contract.request import CheckOptions, CheckRequest, build_spec
from app.core.request.parse import plan_request
from app.schemas.lr_scaling_in import LrScalingIn
from app.worker.checks.lr_scaling.probe import share
from app.worker.checks.lr_scaling.verdict import judge, regime

LR = {"base_lr": 0.01, "base_batch_size": 16, "rule": "linear", "warmup_steps": 2}
PLAN = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 64, "learning_rate": LR}
PROBE = {"plan": PLAN, "lr_scaling": {"samples": 4096, "points": 4}}


@pytest.fixture(scope="module")
def probed(default_worker: TestClient) -> dict[str, Any]:
    """One probe's finished job, shared by the tests that read it."""
    job = run_check(default_worker, PROBE, timeout=120)
    assert job["status"] == "succeeded", job
    return job


def test_the_probe_answers_with_the_shape_a_plan_reads(probed: dict[str, Any]) -> None:
    result = probed["result"]
    assert result["passed"]  # the first step's check ran first, on the same ranks
    probe = result["lr_scaling"]
    assert (probe["samples"], probe["global_batch_size"], probe["tolerance"]) == (4096, 64, 0.05)
    assert probe["base"]["batch_size"] == 16 and probe["base"]["lr"] == 0.01
    assert [r["rule"] for r in probe["rules"]] == ["none", "sqrt", "linear"]
    assert [r["lr"] for r in probe["rules"]] == pytest.approx([0.01, 0.02, 0.04])
    samples = [0, 1024, 2048, 3072, 4096]
    for run in [probe["base"], *probe["rules"]]:
        assert [p["samples"] for p in run["curve"]] == samples
        assert run["curve"][0]["loss"] == probe["base"]["curve"][0]["loss"]  # one initialisation
    base_final = probe["base"]["curve"][-1]["loss"]
    for run in probe["rules"]:
        assert run["final_loss_ratio"] == pytest.approx(run["curve"][-1]["loss"] / base_final)
        assert run["holds"] == (run["final_loss_ratio"] <= 1.05)
    best = min(probe["rules"], key=lambda r: r["final_loss_ratio"])
    assert probe["best_rule"] == best["rule"] and probe["plan_rule"] == "linear"
    assert probe["plan_rule_holds"] == probe["rules"][2]["holds"]
    noise = probe["noise_scale"]
    assert noise["start"] > 0 and noise["end"] > 0
    assert probe["regime"] == regime(64, noise["start"])
    assert probe["verdict"].startswith("at 64, ") and "16-sample run over 4,096 samples" in probe["verdict"]
    LrScalingIn.model_validate(probe)  # what a plan takes back


def test_seeded_reruns_give_the_same_curves_in_float64(
    default_worker: TestClient, probed: dict[str, Any]
) -> None:
    again = check_result(default_worker, PROBE, timeout=120)
    assert again["lr_scaling"] == probed["result"]["lr_scaling"]  # bit for bit, verdict included
    other = check_result(default_worker, {**PROBE, "seed": 1}, timeout=120)
    assert other["lr_scaling"]["base"]["curve"] != probed["result"]["lr_scaling"]["base"]["curve"]


def test_the_curves_do_not_depend_on_how_many_ranks_ran_them(probed: dict[str, Any]) -> None:
    """The same probe in this process, on one rank: the warm ranks' answer to the last bit."""
    from support.one_rank import one_rank_group

    from app.contract.codec import encode
    from app.schemas.checks import CheckRequestIn
    from app.worker.checks.driver import run_spec
    from app.worker.training.workload import SyntheticWorkload

    spec = build_spec(CheckRequestIn.model_validate(PROBE).to_core())
    with one_rank_group() as group:
        here = run_spec(spec, group, SyntheticWorkload(0), None)
    assert here is not None and encode(here)["lr_scaling"] == probed["result"]["lr_scaling"]


def test_a_real_probe_feeds_the_plan(default_worker: TestClient, probed: dict[str, Any]) -> None:
    measured = {**LR, "rule": "measured", "lr_scaling_check": probed["id"]}
    plan = default_worker.post("/v1/plans", json={**PLAN, "learning_rate": measured})
    assert plan.status_code == 200, plan.text
    probe = probed["result"]["lr_scaling"]
    lr = plan.json()["learning_rate"]
    assert (lr["requested_rule"], lr["rule"]) == ("measured", probe["best_rule"])
    assert lr["measured"]["check"] == probed["id"] and lr["measured"]["verdict"] == probe["verdict"]
    by_numbers = {**LR, "rule": "measured", "lr_scaling": probe}
    again = default_worker.post("/v1/plans", json={**PLAN, "learning_rate": by_numbers}).json()
    assert again["learning_rate"]["rule"] == probe["best_rule"]


def test_the_chart_draws_a_probe_and_refuses_a_check_that_was_none(
    default_worker: TestClient, probed: dict[str, Any]
) -> None:
    png = default_worker.get(f"/v1/checks/{probed['id']}/lr_scaling.png")
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")
    svg = default_worker.get(f"/v1/checks/{probed['id']}/lr_scaling.svg")
    assert svg.headers["content-type"].startswith("image/svg+xml") and b"linear" in svg.content
    plain = run_check(default_worker, {"plan": PLAN})
    missing = default_worker.get(f"/v1/checks/{plain['id']}/lr_scaling.png")
    assert missing.status_code == 404 and "not an lr-scaling probe" in missing.json()["detail"]
    assert default_worker.get("/v1/checks/nope/lr_scaling.png").status_code == 404


@pytest.mark.parametrize(
    "options",
    [{"model": "mlp"}, {"workload": "tokens"}],
    ids=["registered", "tokens"],
)
def test_a_registered_model_and_the_tokens_workload_are_probed(
    default_worker: TestClient, options: dict[str, Any]
) -> None:
    body = {**PROBE, **options, "lr_scaling": {"samples": 1024, "points": 2}}
    probe = check_result(default_worker, body, timeout=180)["lr_scaling"]
    assert [r["rule"] for r in probe["rules"]] == ["none", "sqrt", "linear"]
    curves = [probe["base"]["curve"], *(r["curve"] for r in probe["rules"])]
    assert all([p["samples"] for p in c] == [0, 512, 1024] for c in curves)
    assert all(c[0]["loss"] == curves[0][0]["loss"] and c[-1]["loss"] is not None for c in curves)
    assert probe["base"]["curve"][-1]["loss"] < probe["base"]["curve"][0]["loss"]  # it learns


@pytest.mark.parametrize(
    ("change", "pointer", "says"),
    [
        ({"lr_scaling": {"samples": 32}}, "/lr_scaling/samples", "at least 64"),
        ({"lr_scaling": {"samples": 4096, "rules": ["linear", "cubic"]}}, "/lr_scaling/rules/1", "sqrt"),
        ({"plan": {**PLAN, "learning_rate": None}}, "/plan/learning_rate", "base_lr"),
        (
            {"lr_scaling": {"samples": 4096, "label_noise": 1}, "model": "mlp"},
            "/lr_scaling/label_noise",
            "",
        ),
    ],
)
def test_bad_input_is_a_422_at_its_field_with_what_works(
    default_worker: TestClient, change: dict[str, Any], pointer: str, says: str
) -> None:
    body = {**copy.deepcopy(PROBE), **change}
    problem = assert_field_error(default_worker.post("/v1/checks", json=body), pointer)
    assert says in str(problem), problem


# ------------------------------------------------------------------------ without ranks


def _spec(**options: Any) -> LrScalingSpec:
    request = CheckRequest(plan_request(PLAN), CheckOptions(lr_scaling=LrScalingOptions(**options)))
    probe = build_spec(request).lr_scaling
    assert probe is not None
    return probe


def test_the_schedule_is_the_plans_counted_in_samples_and_the_plan_rule_is_added() -> None:
    probe = _spec(samples=1000, rules=("sqrt",))
    assert probe.samples == 960 and probe.points[0] == 0 and probe.points[-1] == 960
    assert [r.rule for r in probe.runs] == ["sqrt", "linear"]  # the plan's own, added
    assert (probe.base.batch_size, probe.base.recipe.lr, probe.base.recipe.warmup_steps) == (16, 0.01, 2)


def test_the_runs_are_shared_longest_first_over_the_ranks() -> None:
    probe = _spec(samples=4096)
    assert share(probe, 1) == [[0, 1, 2, 3]]
    two = share(probe, 2)
    assert two[0] == [0] and sorted(two[1]) == [1, 2, 3]  # the base run has 4x the steps
    assert sorted(i for r in share(probe, 8) for i in r) == [0, 1, 2, 3]


def test_the_verdict_names_the_best_rule_and_the_laggards() -> None:
    probe = _spec(samples=4096, tolerance=0.02)

    def curve(final: float | None) -> list[tuple[int, float | None]]:
        return [(0, 2.0), (4096, final)]

    runs: list[tuple[ProbeRunSpec, list[tuple[int, float | None]]]] = [
        (probe.base, curve(1.0)),
        (probe.runs[0], curve(1.09)),
        (probe.runs[1], curve(None)),
        (probe.runs[2], curve(1.012)),
    ]
    found = judge(probe, runs, (1000.0, 3000.0))
    assert found.best_rule == "linear" and found.plan_rule_holds
    assert [r.holds for r in found.rules] == [False, False, True]
    assert found.rules[1].final_loss_ratio is None
    assert found.regime == "below_noise_scale" and found.noise_scale.batch_to_noise == pytest.approx(0.064)
    assert found.verdict.startswith(
        "at 64, linear scaling to 0.04 keeps the loss within 1.2 % of the 16-sample run over 4,096 samples"
    )
    assert "none (lr 0.01) lags by 9.0 %" in found.verdict and "sqrt (lr 0.02) diverges" in found.verdict
    diverged = judge(probe, [(probe.base, curve(None)), *runs[1:]], (None, None))
    assert (
        diverged.verdict.startswith("the base run (16 at lr 0.01) diverges") and not diverged.plan_rule_holds
    )
    assert diverged.regime == "unknown" and diverged.noise_scale.batch_to_noise is None
    assert regime(64, None) == "unknown" and regime(64, 100) == "around_noise_scale"
    assert regime(512, 100) == "above_noise_scale"
