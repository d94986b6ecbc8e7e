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
from app.worker.checks.lr_scaling.verdict import Judged, judge, regime

LR = {"base_lr": 0.01, "base_batch_size": 16, "rule": "linear", "warmup_steps": 2}
PLAN = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 64, "learning_rate": LR}
PROBE = {"plan": PLAN, "lr_scaling": {"samples": 4096, "points": 4}}
WHOLE = {**PLAN, "learning_rate": {**LR, "train_steps": 100}}  # a plan that states its run's length


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
    assert probe["length"] == "samples" and isinstance(probe["could_change"], list)
    assert probe["base"]["batch_size"] == 16 and probe["base"]["lr"] == 0.01
    assert [r["rule"] for r in probe["rules"]] == ["none", "sqrt", "linear"]
    assert [r["lr"] for r in probe["rules"]] == pytest.approx([0.01, 0.02, 0.04])
    samples = [0, 1024, 2048, 3072, 4096]
    for run in [probe["base"], *probe["rules"]]:
        assert [p["samples"] for p in run["curve"]] == samples
        assert run["curve"][0]["loss"] == probe["base"]["curve"][0]["loss"]  # one initialisation
    base_final = probe["base"]["curve"][-1]["loss"]
    assert probe["seeds"] == 3 and len(set(probe["base"]["final_losses"])) == 3  # three draws
    assert probe["base"]["final_losses"][0] == base_final and probe["tolerance_unit"] == "relative"
    for run in probe["rules"]:
        ratios = run["seed_ratios"]
        assert ratios[0] == pytest.approx(run["curve"][-1]["loss"] / base_final)  # paired with its seed
        assert run["final_loss_ratio"] == pytest.approx(sum(ratios) / 3)
        held = [r <= 1.05 for r in ratios]
        assert run["outcome"] == ("holds" if all(held) else "fails" if not any(held) else "borderline")
        assert run["holds"] == (run["outcome"] == "holds")
    best = min(probe["rules"], key=lambda r: r["final_loss_ratio"])
    assert probe["best_rule"] == best["rule"] and probe["plan_rule"] == "linear"
    assert probe["tied_for_best"][0] == best["rule"]
    assert probe["plan_rule_holds"] == probe["rules"][2]["holds"]
    noise = probe["noise_scale"]
    assert noise["start"] > 0 and noise["middle"] > 0 and noise["end"] > 0 and noise["used"] == "middle"
    assert probe["regime"] == regime(64, noise["middle"])
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
    body = {**PROBE, **options, "lr_scaling": {"samples": 1024, "points": 2, "seeds": 1}}
    probe = check_result(default_worker, body, timeout=180)["lr_scaling"]
    assert [r["rule"] for r in probe["rules"]] == ["none", "sqrt", "linear"]
    curves = [probe["base"]["curve"], *(r["curve"] for r in probe["rules"])]
    assert all([p["samples"] for p in c] == [0, 512, 1024] for c in curves)
    assert all(c[0]["loss"] == curves[0][0]["loss"] and c[-1]["loss"] is not None for c in curves)
    assert probe["base"]["curve"][-1]["loss"] < probe["base"]["curve"][0]["loss"]  # it learns
    if "model" not in options:
        assert probe["metric_name"] is None and probe["base"]["metric"] is None
        return
    # mlp's factory gives its referee: a held-out set of its task and accuracy, which judge.
    assert (probe["metric_name"], probe["higher_is_better"]) == ("accuracy", True)
    base = probe["base"]["metric"]
    assert 0 < base <= 1 and "by the factory's accuracy" in probe["verdict"]
    for run in probe["rules"]:
        assert run["seed_ratios"] == [pytest.approx(run["metric"] / base)] == [run["metric_ratio"]]
        assert run["outcome"] == ("holds" if run["metric"] >= 0.95 * base else "fails")
        assert run["final_loss_ratio"] == pytest.approx(
            run["curve"][-1]["loss"] / probe["base"]["curve"][-1]["loss"]
        )
    best = max(probe["rules"], key=lambda r: r["metric"])
    assert probe["best_rule"] == best["rule"]


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


def _spec(plan: dict[str, Any] = PLAN, **options: Any) -> LrScalingSpec:
    request = CheckRequest(plan_request(plan), CheckOptions(lr_scaling=LrScalingOptions(**options)))
    probe = build_spec(request).lr_scaling
    assert probe is not None
    return probe


def test_the_schedule_is_the_plans_counted_in_samples_and_the_plan_rule_is_added() -> None:
    probe = _spec(samples=1000, rules=("sqrt",))
    assert probe.samples == 960 and probe.points[0] == 0 and probe.points[-1] == 960
    assert [r.rule for r in probe.runs] == ["sqrt", "linear"]  # the plan's own, added
    assert (probe.base.batch_size, probe.base.recipe.lr, probe.base.recipe.warmup_steps) == (16, 0.01, 2)


def test_the_runs_are_shared_longest_first_over_the_ranks() -> None:
    probe = _spec(samples=4096, seeds=1)
    assert share(probe, 1) == [[(0, 0), (0, 1), (0, 2), (0, 3)]]
    two = share(probe, 2)
    assert two[0] == [(0, 0)] and sorted(two[1]) == [(0, 1), (0, 2), (0, 3)]  # the base: 4x the steps
    three = _spec(samples=4096, seeds=3)
    every = sorted(job for rank in share(three, 8) for job in rank)
    assert every == [(k, i) for k in range(3) for i in range(4)]
    assert [jobs[0] for jobs in share(three, 2)] == [(0, 0), (1, 0)]  # the base runs first, apart


def test_a_factorys_metric_judges_with_the_loss_beside_it() -> None:
    """Accuracy within a point with 1.5x the loss holds; the lowest loss with 10 points less fails."""
    probe = _spec(samples=4096, seeds=1)
    runs = [
        (run, [(0, 2.0), (4096, final)])
        for run, final in zip([probe.base, *probe.runs], [1.0, 1.6, 1.02, 1.5], strict=True)
    ]
    judged = Judged("accuracy", True, [[0.90, 0.70, 0.80, 0.895]])
    found = judge(probe, [runs], (100.0, 1000.0, 3000.0), judged)
    none, sqrt, linear = found.rules
    assert (sqrt.outcome, linear.outcome, none.outcome) == ("fails", "holds", "fails")
    assert linear.final_loss_ratio == pytest.approx(1.5) and linear.metric == 0.895
    assert found.best_rule == "linear" and found.plan_rule_holds and found.metric_name == "accuracy"
    assert found.base.metric == 0.90 and "by the factory's accuracy" in found.verdict


def test_the_verdict_names_the_best_rule_and_the_laggards() -> None:
    probe = _spec(samples=4096, tolerance=0.02, seeds=1)

    def curve(final: float | None) -> list[tuple[int, float | None]]:
        return [(0, 2.0), (4096, final)]

    runs: list[tuple[ProbeRunSpec, list[tuple[int, float | None]]]] = [
        (probe.base, curve(1.0)),
        (probe.runs[0], curve(1.09)),
        (probe.runs[1], curve(None)),
        (probe.runs[2], curve(1.012)),
    ]
    found = judge(probe, [runs], (100.0, 1000.0, 3000.0))
    assert found.best_rule == "linear" and found.plan_rule_holds and found.tied_for_best == ("linear",)
    assert [r.holds for r in found.rules] == [False, False, True]
    assert found.rules[1].final_loss_ratio is None
    assert found.regime == "below_noise_scale" and found.noise_scale.batch_to_noise == pytest.approx(0.064)
    assert found.verdict.startswith(
        "at 64, linear scaling to 0.04 keeps the loss within 1.2 % of the 16-sample run over 4,096 samples"
    )
    assert "none (lr 0.01) lags by 9.0 %" in found.verdict and "sqrt (lr 0.02) diverges" in found.verdict
    diverged = judge(probe, [[(probe.base, curve(None)), *runs[1:]]], (None, None, None))
    assert (
        diverged.verdict.startswith("the base run (16 at lr 0.01) diverges") and not diverged.plan_rule_holds
    )
    assert diverged.regime == "unknown" and diverged.noise_scale.batch_to_noise is None
    assert regime(64, None) == "unknown" and regime(64, 100) == "around_noise_scale"
    assert regime(512, 100) == "above_noise_scale"


def test_the_default_length_is_the_plans_whole_run_and_samples_or_epochs_shorten_it() -> None:
    whole = WHOLE
    probe = _spec(whole)
    assert (probe.samples, probe.length, probe.whole_run) == (6400, "whole_run", 6400)
    assert (_spec(whole, samples=640).samples, _spec(whole, samples=640).length) == (640, "samples")
    epochs = {**PLAN, "dataset": {"num_samples": 1000, "epochs": 4}}
    assert (_spec(epochs).samples, _spec(epochs).whole_run) == (4096, 4096)  # the plan's 16 steps an epoch
    assert (_spec(epochs, epochs=2).samples, _spec(epochs, epochs=2).length) == (1984, "epochs")


@pytest.mark.parametrize(
    ("plan", "options", "pointer", "says"),
    [
        (PLAN, {}, "/lr_scaling/samples", "states no length"),
        (PLAN, {"epochs": 2}, "/lr_scaling/epochs", "plan.dataset"),
        (WHOLE, {"samples": 64, "epochs": 1}, "/lr_scaling/epochs", "not both"),
        (WHOLE, {"samples": 32}, "/lr_scaling/samples", "whole run, 6,400"),
    ],
    ids=["no_length", "epochs_without_dataset", "both", "short_suggests_the_whole_run"],
)  # fmt: skip
def test_a_length_the_probe_cannot_take_is_refused_at_its_field(
    plan: dict[str, Any], options: dict[str, Any], pointer: str, says: str
) -> None:
    from app.core.errors.domain import InvalidValue

    with pytest.raises(InvalidValue) as refused:
        _spec(plan, **options)
    assert refused.value.pointer == pointer and says in str(refused.value)


def _falling(probe: LrScalingSpec, rule_end: float) -> Any:
    """The base run flat at its end, none and linear too, sqrt still falling steeply."""
    base = [(0, 2.0), (2048, 1.01), (4096, 1.0)]
    sqrt = [(0, 2.0), (2048, 1.5), (4096, rule_end)]
    flat = [(0, 2.0), (2048, 1.03), (4096, 1.02)]
    runs = [(probe.base, base), (probe.runs[0], flat), (probe.runs[1], sqrt), (probe.runs[2], flat)]
    return judge(probe, [runs], (100.0, 1000.0, 3000.0))


def test_a_short_probe_says_which_rules_were_still_falling_and_the_length_that_settles_them() -> None:
    whole = {**PLAN, "learning_rate": {**LR, "train_steps": 1000}}
    found = _falling(_spec(whole, samples=4096, seeds=1), 1.2)
    assert found.base.last_interval_fall == pytest.approx(0.01 / 1.01)
    sqrt = found.rules[1]
    assert sqrt.still_falling and sqrt.last_interval_fall == pytest.approx(0.2) and not sqrt.holds
    assert not found.rules[0].still_falling and not found.rules[2].still_falling
    assert found.could_change == ("sqrt",) and found.settling_samples == 4096 * 4  # G / b = 4
    assert "still falling when the probe stopped (sqrt fell 20.0 %" in found.verdict
    assert "sqrt could still change: probe 16,384 samples" in found.verdict
    at_whole = _falling(_spec(whole, seeds=1), 1.2)  # real training stops there too: nothing to settle
    assert (
        at_whole.rules[1].still_falling and at_whole.could_change == () and at_whole.settling_samples is None
    )
    assert "still falling" not in at_whole.verdict and "whole run's 64,000 samples" in at_whole.verdict


def test_seeds_give_each_rule_a_mean_a_spread_an_outcome_and_the_best_only_beyond_the_spread() -> None:
    probe = _spec(samples=4096, seeds=3)  # tolerance 5 %, relative
    end = {
        "base": (1.0, 2.0, 1.5),
        "none": (1.2, 2.4, 1.8),
        "sqrt": (1.02, 2.2, 1.35),
        "linear": (0.99, 2.12, 1.4),
    }
    seeds = [
        [
            (run, [(0, 3.0), (4096, end[run.rule if run.rule in end else "base"][k])])
            for run in (probe.base, *probe.runs)
        ]
        for k in range(3)
    ]
    found = judge(probe, seeds, (1000.0, None, None))
    none, sqrt, linear = found.rules
    assert none.seed_ratios == pytest.approx((1.2, 1.2, 1.2)) and none.outcome == "fails" and not none.holds
    assert none.ratio_spread == pytest.approx(0.0)
    assert sqrt.seed_ratios == pytest.approx((1.02, 1.1, 0.9)) and sqrt.outcome == "borderline"
    assert sqrt.final_loss_ratio == pytest.approx((1.02 + 1.1 + 0.9) / 3)
    assert sqrt.ratio_spread == pytest.approx(0.1006645, rel=1e-5)
    assert linear.outcome == "borderline"  # 1.06 in the second seed: beyond 5 %
    assert found.best_rule == "linear" and found.tied_for_best == ("linear", "sqrt")  # sqrt wins seed 3
    assert found.base.final_losses == (1.0, 2.0, 1.5)
    assert (
        "over 3 seeds" in found.verdict
        and "tied for best within the seeds' spread: linear, sqrt" in found.verdict
    )
    assert "sqrt is borderline (seeds 0.900 to 1.100 of the base run)" in found.verdict


def test_the_tolerance_has_a_unit_nats_for_a_cross_entropy() -> None:
    assert (_spec(samples=4096).tolerance, _spec(samples=4096).tolerance_unit) == (0.05, "relative")
    request = CheckRequest(
        plan_request(PLAN),
        CheckOptions(lr_scaling=LrScalingOptions(samples=4096, seeds=1), workload="tokens"),
    )
    tokens = build_spec(request).lr_scaling
    assert tokens is not None and (tokens.tolerance, tokens.tolerance_unit) == (0.02, "nats")
    probe = _spec(samples=4096, seeds=1, tolerance=0.1, tolerance_unit="nats")
    base = [(0, 3.0), (4096, 2.0)]
    runs = [
        (probe.base, base),
        *((run, [(0, 3.0), (4096, 2.0 + 0.09 * j)]) for j, run in enumerate(probe.runs)),
    ]
    found = judge(probe, [runs], (None, None, None))
    assert [r.holds for r in found.rules] == [True, True, False]  # 0, 0.09 and 0.18 nats above
    assert found.rules[1].final_loss_ratio == pytest.approx(1.045)


def test_the_noise_scale_is_read_halfway_and_a_prediction_the_measurement_refutes_is_named() -> None:
    """Issue 52's case: linear ends 14 % below the base run where McCandlish et al. predict it
    overshoots x5.68; the verdict says they disagree and names the likely cause."""
    probe = _spec(samples=4096, seeds=1)
    ends = {"base": 1.0, "none": 1.6, "sqrt": 1.3, "linear": 0.86}
    runs = [(run, [(0, 2.0), (4096, ends[run.rule])]) for run in (probe.base, *probe.runs)]
    found = judge(probe, [runs], (1.5, 4.0, 120.0))  # it grows along the run
    noise = found.noise_scale
    assert (noise.start, noise.middle, noise.end, noise.used) == (1.5, 4.0, 120.0, "middle")
    assert noise.linear_overshoot == pytest.approx((64 + 4) / (16 + 4))
    assert found.regime == "above_noise_scale" and found.prediction_agrees is False
    assert "B_noise ~ 4 (halfway through the base run; 1.5 at the start, 120 at the end)" in found.verdict
    assert (
        "measurement and prediction disagree: linear holds although McCandlish et al. predict"
        in found.verdict
    )
    assert "base_lr is below its best at the base batch" in found.verdict
    agreeing = judge(probe, [runs], (None, None, 1000.0))  # the end's, where nothing else was measured
    assert agreeing.noise_scale.used == "end" and agreeing.prediction_agrees is True
    assert "disagree" not in agreeing.verdict


def test_a_noise_scale_that_could_not_be_measured_says_why() -> None:
    """Near a minimum the mean gradient is within its noise and the estimate of |G|^2 falls to 0
    or below: the end's B_noise is null, and the result and the verdict say why instead of
    leaving a bare null."""
    probe = _spec(samples=4096, seeds=1)
    ends = {"base": 1.0, "none": 1.02, "sqrt": 1.01, "linear": 1.0}
    runs = [(run, [(0, 2.0), (4096, ends[run.rule])]) for run in (probe.base, *probe.runs)]
    converged = "the mean gradient is within its own noise: the run is near a minimum"
    found = judge(probe, [runs], (1.5, 40.0, None), None, (None, None, converged))
    assert found.noise_scale.used == "middle" and found.noise_scale.end is None
    assert found.noise_scale.unmeasured == (f"end: {converged}",)
    diverged = judge(probe, [runs], (None, None, None), None, ("x", "the base run diverged before it", None))
    assert diverged.noise_scale.unmeasured == ("start: x", "middle: the base run diverged before it")
    words = "the noise scale could not be measured (start: x; middle: the base run diverged"
    assert words in diverged.verdict
