"""A long lr-scaling probe holds no one up (the shared default worker, real gloo ranks): it runs
in its own lane on all but one rank, so a one-step check sent while it trains answers within a
second; a probe that cannot finish within its timeout is refused at admission with the
estimate; a probe's timeout names the fields to change; `batchplan check` exits 1 when the
probe refutes the plan's own rule. The cost model without ranks."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.polling import run_check, wait_check, wait_for
from support.problems import assert_field_error

from app.cli.output import show_check
from app.contract.check_options import MAX_LR_PROBE_SAMPLES
from app.contract.kinds.lr_scaling import LrScalingSpec
from app.worker.service.probe_cost import DEFAULT_S_PER_SAMPLE, MEASURABLE_LAP_S, ProbeCost, work

LR = {"base_lr": 0.01, "base_batch_size": 16, "rule": "linear", "warmup_steps": 2}
PROBE_PLAN = {"topology": {"num_nodes": 1, "gpus_per_node": 4}, "global_batch_size": 64, "learning_rate": LR}
ONE_STEP = {"plan": {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 8}}


def probe(samples: int, **options: Any) -> dict[str, Any]:
    # One seed: the lane and the timeout are what these probes test, sized for one seed.
    return {"plan": PROBE_PLAN, "lr_scaling": {"samples": samples, "points": 2, "seeds": 1}, **options}


def test_a_probe_at_the_schema_maximum_is_refused_with_its_estimate(default_worker: TestClient) -> None:
    response = default_worker.post("/v1/checks", json=probe(MAX_LR_PROBE_SAMPLES))
    body = assert_field_error(response, "/lr_scaling/samples")
    detail = body["errors"][0]["detail"]
    assert "would train for about" in detail and "timeout_s=120" in detail, detail
    (fits,) = body["suggestions"]["lr_scaling.samples"]
    assert 64 <= fits < MAX_LR_PROBE_SAMPLES and fits % 64 == 0
    assert f"at most {fits:,}" in detail
    # A shorter timeout says the other way out too; the suggested size is admitted.
    response = default_worker.post("/v1/checks", json=probe(MAX_LR_PROBE_SAMPLES, timeout_s=30))
    short = assert_field_error(response, "/lr_scaling/samples")
    assert "or raise timeout_s (at most 120" in short["errors"][0]["detail"]
    admitted = default_worker.post("/v1/checks", json=probe(fits))
    assert admitted.status_code == 202, admitted.text
    default_worker.delete(admitted.headers["location"])


def test_a_one_step_check_answers_within_a_second_while_a_long_probe_runs(default_worker: TestClient) -> None:
    started = default_worker.post("/v1/checks", json=probe(1 << 20))
    if started.status_code == 422:
        # Admission measured a loaded host's cost per sample: the largest probe that fits its
        # timeout still trains for most of it, long enough to hold three ranks.
        (fits,) = started.json()["suggestions"]["lr_scaling.samples"]
        started = default_worker.post("/v1/checks", json=probe(fits))
    assert started.status_code == 202, started.text
    location = started.headers["location"]
    try:
        wait_check(default_worker, location, ("running",), timeout=60)
        # It trains on 3 of the 4 ranks: one stays free for the short lane.
        wait_for(lambda: default_worker.get("/v1/host").json()["busy_processes"] == 3, "the probe's ranks")
        sent = time.monotonic()
        short = default_worker.post("/v1/checks", json=ONE_STEP)
        job = wait_check(default_worker, short.headers["location"], timeout=30)
        answered = time.monotonic() - sent
        assert job["status"] == "succeeded" and job["result"]["passed"], job
        assert default_worker.get(location).json()["status"] == "running"  # the probe still trains
        assert answered < 1.0, (answered, job["result"]["timings_s"])
    finally:
        default_worker.delete(location)


def test_a_probe_that_times_out_names_the_fields_to_change(
    default_worker: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    response = default_worker.post("/v1/checks", json=probe(1 << 20, timeout_s=2))
    assert_field_error(response, "/lr_scaling/samples")  # refused: 2 s is too short for it
    # A probe admission lets through (its samples taken as almost free, as before any probe has
    # been measured on a fast host) that then runs past its timeout: the failure names the fields.
    cost = default_worker.app.state.checks.probe_cost  # type: ignore[attr-defined]
    monkeypatch.setattr(cost, "per_sample_s", lambda: (1e-9, True))
    job = wait_check(default_worker, _posted(default_worker, probe(16384, timeout_s=0.5)), timeout=30)
    assert job["status"] == "failed", job
    assert "lower lr_scaling.samples (it was 16,384) or raise timeout_s" in job["error"], job["error"]


def test_check_exits_1_when_the_probe_refutes_the_plans_rule(default_worker: TestClient, capsys: Any) -> None:
    """`batchplan check --lr-scaling`'s status, for CI to gate on: the check passed, but the plan's
    linear rule (4x a base_lr already near its edge) fails the probe, so the command fails."""
    lr = {"base_lr": 0.5, "base_batch_size": 16, "rule": "linear", "warmup_steps": 0}
    plan = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 64, "learning_rate": lr}
    job = run_check(default_worker, {"plan": plan, "lr_scaling": {"samples": 2048, "points": 2}}, timeout=120)
    assert job["status"] == "succeeded" and job["result"]["passed"], job
    assert job["result"]["lr_scaling"]["plan_rule_holds"] is False, job["result"]["lr_scaling"]
    assert show_check(job, as_json=False) == 1
    assert "the plan's lr rule (linear) does not hold in the probe" in capsys.readouterr().err


def _posted(client: TestClient, body: dict[str, Any]) -> str:
    response = client.post("/v1/checks", json=body)
    assert response.status_code == 202, response.text
    location: str = response.headers["location"]
    return location


def _spec(samples: int, rules: int, seeds: int = 1) -> LrScalingSpec:
    from app.contract.kinds.lr_scaling import ProbeRunSpec

    run = ProbeRunSpec("none", 64, None)  # type: ignore[arg-type]  # the cost reads no recipe
    return LrScalingSpec(
        samples=samples,
        global_batch_size=64,
        length="samples",
        whole_run=None,
        points=(0, samples),
        tolerance=0.05,
        tolerance_unit="relative",
        seeds=seeds,
        label_noise=0.0,
        plan_rule="linear",
        base=run,
        runs=(run,) * rules,
    )


def test_the_cost_per_sample_is_the_lowest_measured_and_short_laps_do_not_count() -> None:
    cost = ProbeCost()
    spec = _spec(1 << 20, 3)
    assert work(spec, 3) == 2 << 20 and work(spec, 8) == 1 << 20
    assert work(_spec(1 << 20, 3, seeds=3), 3) == 4 << 20  # every run once per seed: 12 on 3 ranks
    assert cost.per_sample_s() == (DEFAULT_S_PER_SAMPLE, False)
    cost.observe(spec, 3, MEASURABLE_LAP_S / 2)  # mostly fixed costs
    assert cost.per_sample_s() == (DEFAULT_S_PER_SAMPLE, False)
    cost.observe(spec, 3, 20.0)
    cost.observe(spec, 3, 10.0)
    assert cost.per_sample_s() == (10.0 / (2 << 20), True)
