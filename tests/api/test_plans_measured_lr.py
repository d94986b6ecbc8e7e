"""The plan uses what it learns (issue 39's plan side): `learning_rate.rule: "measured"` with an
lr-scaling probe's numbers (`lr_scaling`) or its check id (`lr_scaling_check`, looked up in the
server's check store), each wrong use a 4xx at its field; without a measurement the explanation
says the rule is an assumption and how to measure it; a large scale-up without warmup is warned
about, citing Goyal et al.'s gradual warmup.

The probe itself is the worker's (built later); here a fake runner's check answers with the
probe's result shape, recorded through the real check service and store."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.apps import runner_client, succeeded, wait_job
from support.bodies import put
from support.fake_runner import FakeRunner
from support.problems import assert_field_error, assert_wrong_plan

from app.contract.check_result import CheckResult
from app.schemas.examples import plan_example
from app.worker.service.runner import CheckOrder, RankError

MEASURED = plan_example("measured_lr")  # 8 replicas, global 512, base 0.1 at 64, linear measured best
PROBE = MEASURED["learning_rate"]["lr_scaling"]
ASSUMED = put(put(MEASURED, "learning_rate.rule", "linear"), "learning_rate.lr_scaling", None)
EVEN_2 = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}


@dataclasses.dataclass(frozen=True)
class ProbeResult(CheckResult):
    """A check result with a hand-written lr-scaling probe's answer in it (the plan's example);
    test_a_real_probe_feeds_the_plan runs the worker's own."""

    lr_scaling: dict[str, Any] | None = None  # type: ignore[assignment]  # the example's JSON


class ProbeRunner(FakeRunner):
    """While `probe` is set, a check answers as an lr-scaling probe with it."""

    probe: dict[str, Any] | None = None

    async def run_check(self, order: CheckOrder) -> CheckResult:
        result = await super().run_check(order)
        if self.probe is None:
            return result
        fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(CheckResult)}
        return ProbeResult(**{**fields, "lr_scaling": self.probe})


@pytest.fixture
def runner() -> ProbeRunner:
    return ProbeRunner()


@pytest.fixture
def checks(tmp_path: Path, runner: ProbeRunner) -> Iterator[TestClient]:
    yield from runner_client(tmp_path, runner)


def _probe_id(client: TestClient, runner: ProbeRunner, probe: dict[str, Any] | None = PROBE) -> str:
    runner.probe = probe
    try:
        return str(succeeded(client, {"plan": EVEN_2})["id"])
    finally:
        runner.probe = None


def _by_id(check_id: str) -> dict[str, Any]:
    body = copy.deepcopy(MEASURED)
    del body["learning_rate"]["lr_scaling"]
    body["learning_rate"]["lr_scaling_check"] = check_id
    return body


# ----------------------------------------------------------------------------- the numbers


def test_the_plan_takes_the_measured_best_rule_and_says_so(client: TestClient) -> None:
    plan = client.post("/v1/plans", json=MEASURED).json()
    lr = plan["learning_rate"]
    assert (lr["requested_rule"], lr["rule"], lr["lr"]) == ("measured", "linear", 0.8)
    assert lr["measured"] == {
        "check": None,
        "best_rule": "linear",
        "holds": True,
        "final_loss_ratio": 1.012,
        "verdict": PROBE["verdict"],
    }
    why = " ".join(plan["explanation"])
    assert "The linear rule is measured, not assumed" in why and PROBE["verdict"] in why
    assert "is an assumption" not in why
    # The best rule decides: had the probe found sqrt best, the plan scales by sqrt.
    sqrt = put(MEASURED, "learning_rate.lr_scaling.best_rule", "sqrt")
    assert client.post("/v1/plans", json=sqrt).json()["learning_rate"]["rule"] == "sqrt"


def test_a_best_rule_that_did_not_hold_is_warned_about(client: TestClient) -> None:
    body = put(MEASURED, "learning_rate.lr_scaling.rules.2.holds", False)
    plan = client.post("/v1/plans", json=body).json()
    assert any("did not hold either" in w for w in plan["warnings"]), plan["warnings"]


def test_a_probe_of_another_global_batch_is_warned_about(client: TestClient) -> None:
    plan = client.post("/v1/plans", json=put(MEASURED, "global_batch_size", 1024)).json()
    assert any("the probe measured another global batch" in w for w in plan["warnings"]), plan["warnings"]
    assert not any(
        "another global batch" in w for w in client.post("/v1/plans", json=MEASURED).json()["warnings"]
    )


# ----------------------------------------------------------------------------- the check id


def test_the_probe_is_looked_up_by_its_check_id(checks: TestClient, runner: ProbeRunner) -> None:
    check_id = _probe_id(checks, runner)
    response = checks.post("/v1/plans", json=_by_id(check_id))
    assert response.status_code == 200, response.text
    plan = response.json()
    by_numbers = checks.post("/v1/plans", json=MEASURED).json()
    assert plan["learning_rate"]["lr"] == by_numbers["learning_rate"]["lr"]
    assert plan["learning_rate"]["measured"] == {**by_numbers["learning_rate"]["measured"], "check": check_id}
    assert f"the lr-scaling probe (check {check_id})" in " ".join(plan["explanation"])
    # Every route that plans a request reads it the same way.
    exported = checks.post("/v1/plans/export/deepspeed", json=_by_id(check_id))
    assert exported.status_code == 200, exported.text
    scheduled = checks.post("/v1/plans/schedule", json={"plan": _by_id(check_id)})
    assert scheduled.status_code == 200, scheduled.text
    checked = checks.post("/v1/checks", json={"plan": _by_id(check_id)})
    assert checked.status_code == 202, checked.text


def test_an_unknown_check_id_is_a_422_at_its_field(checks: TestClient) -> None:
    problem = assert_field_error(
        checks.post("/v1/plans", json=_by_id("0" * 32)), "/learning_rate/lr_scaling_check"
    )
    assert "no check" in problem["detail"] and "lr_scaling" in problem["detail"]


def test_a_check_that_is_not_a_probe_is_a_422(checks: TestClient) -> None:
    plain = succeeded(checks, {"plan": EVEN_2})["id"]
    problem = assert_field_error(
        checks.post("/v1/plans", json=_by_id(plain)), "/learning_rate/lr_scaling_check"
    )
    assert "not an lr-scaling probe" in problem["detail"]


def test_a_failed_probe_is_a_422(checks: TestClient, runner: ProbeRunner) -> None:
    runner.error = RankError("rank 1 fell over")
    failed = wait_job(checks, checks.post("/v1/checks", json={"plan": EVEN_2}).headers["location"], "failed")[
        "id"
    ]
    problem = assert_field_error(
        checks.post("/v1/plans", json=_by_id(failed)), "/learning_rate/lr_scaling_check"
    )
    assert "failed without a result" in problem["detail"] and "rank 1 fell over" in problem["detail"]


def test_a_probe_still_running_is_a_409_until_it_finishes(checks: TestClient, runner: ProbeRunner) -> None:
    gate = runner.gate = checks.portal.call(_event)  # type: ignore[union-attr]
    runner.probe = PROBE
    location = checks.post("/v1/checks", json={"plan": EVEN_2}).headers["location"]
    check_id = wait_job(checks, location, "running")["id"]
    problem = assert_field_error(
        checks.post("/v1/plans", json=_by_id(check_id)), "/learning_rate/lr_scaling_check", 409
    )
    assert "is running" in problem["detail"] and "?wait=" in problem["detail"]
    checks.portal.call(gate.set)  # type: ignore[union-attr]
    wait_job(checks, location, "succeeded")
    assert checks.post("/v1/plans", json=_by_id(check_id)).status_code == 200


def test_an_id_and_numbers_together_are_refused(checks: TestClient, runner: ProbeRunner) -> None:
    both = _by_id(_probe_id(checks, runner))
    both["learning_rate"]["lr_scaling"] = PROBE
    problem = assert_field_error(checks.post("/v1/plans", json=both), "/learning_rate/lr_scaling_check")
    assert "not both" in problem["detail"]


def test_a_server_without_checks_says_to_give_the_numbers(client: TestClient) -> None:
    problem = assert_field_error(
        client.post("/v1/plans", json=_by_id("abc")), "/learning_rate/lr_scaling_check"
    )
    assert "learning_rate.lr_scaling" in problem["detail"]


async def _event() -> asyncio.Event:
    return asyncio.Event()


# ----------------------------------------------------------------------------- wrong uses


WRONG = [
    # (request, pointer, words the detail must hold: what works)
    (
        put(MEASURED, "learning_rate.lr_scaling", None),
        "/learning_rate/rule",
        "POST /v1/checks with lr_scaling",
    ),
    (
        put(MEASURED, "learning_rate.rule", "linear"),
        "/learning_rate/rule",
        "set learning_rate.rule to measured",
    ),
    (
        put(MEASURED, "learning_rate.lr_scaling.best_rule", "lars"),
        "/learning_rate/lr_scaling/best_rule",
        "linear, sqrt or none",
    ),
    (
        put(MEASURED, "learning_rate.lr_scaling.best_rule", None),
        "/learning_rate/lr_scaling/best_rule",
        "named no best rule",
    ),
    (
        put(MEASURED, "learning_rate.base_batch_size", 128),
        "/learning_rate/base_batch_size",
        "use base_batch_size 64",
    ),
    (put(MEASURED, "learning_rate.base_lr", 0.2), "/learning_rate/base_lr", "use base_lr 0.1"),
]


@pytest.mark.parametrize(("body", "pointer", "works"), WRONG, ids=[w[1] + ":" + w[2] for w in WRONG])
def test_wrong_uses_are_a_422_at_their_field(
    client: TestClient, body: dict[str, Any], pointer: str, works: str
) -> None:
    assert_wrong_plan(client, body, pointer, works)


def test_the_cli_and_rank_program_refuse_an_id_they_cannot_look_up() -> None:
    from app.core.errors.domain import InvalidValue
    from app.core.planner import plan
    from app.core.request.parse import plan_request

    with pytest.raises(InvalidValue) as refused:
        plan(plan_request(_by_id("abc")))
    assert refused.value.pointer == "/learning_rate/lr_scaling_check"
    assert "learning_rate.lr_scaling" in refused.value.detail


# ----------------------------------------------------------------------------- without a measurement


def test_an_assumed_rule_says_so_and_how_to_measure_it(client: TestClient) -> None:
    plan = client.post("/v1/plans", json=ASSUMED).json()
    assert plan["learning_rate"]["measured"] is None
    why = " ".join(plan["explanation"])
    assert "The linear rule is an assumption, not a measurement on this model" in why
    assert "POST /v1/checks with lr_scaling" in why and "batchplan check --lr-scaling SAMPLES" in why
    assert 'learning_rate.rule "measured"' in why
    # At the base batch itself nothing is scaled, and nothing is assumed.
    at_base = client.post("/v1/plans", json=put(ASSUMED, "global_batch_size", 64)).json()
    assert "is an assumption" not in " ".join(at_base["explanation"])


@pytest.mark.parametrize(
    ("global_batch", "warmup_steps", "warned"),
    [(512, None, True), (256, None, True), (128, None, False), (512, 100, False)],
    ids=["8x", "4x", "2x", "8x-with-warmup"],
)
def test_a_4x_scale_up_without_warmup_cites_goyals_gradual_warmup(
    client: TestClient, global_batch: int, warmup_steps: int | None, warned: bool
) -> None:
    body = put(put(ASSUMED, "global_batch_size", global_batch), "learning_rate.warmup_steps", warmup_steps)
    plan = client.post("/v1/plans", json=body).json()
    cites = [w for w in plan["warnings"] if "Goyal et al. 2017" in w and "gradual warmup" in w]
    assert bool(cites) == warned, plan["warnings"]
    if warned:
        assert "no warmup" in cites[0] and "learning_rate.warmup_epochs" in cites[0]


def test_the_warning_counts_the_measured_factor_too(client: TestClient) -> None:
    body = put(MEASURED, "learning_rate.warmup_steps", None)
    assert any("Goyal et al. 2017" in w for w in client.post("/v1/plans", json=body).json()["warnings"])
