"""The recipe over HTTP: every new learning_rate field's limits are 422 problems at the field,
whose suggested values (and the values the detail names) work; the plan states its schedule,
and the schedule answer and its chart follow the plan's recipe."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.bodies import put

# ImageNet on 16 GPUs: 2503 optimizer steps an epoch, 225270 in 90 epochs, lr 0.2.
BASE = {
    "topology": {"num_nodes": 2, "gpus_per_node": 8},
    "global_batch_size": 512,
    "dataset": {"num_samples": 1281167, "epochs": 90},
}


def body(**lr: Any) -> dict[str, Any]:
    return {**BASE, "learning_rate": {"base_lr": 0.1, "rule": "linear", "warmup_epochs": 5, **lr}}


WRONG = [
    # (the request, the pointer of the field at fault)
    (body(weight_decay=-0.1), "/learning_rate/weight_decay"),
    (body(weight_decay=2), "/learning_rate/weight_decay"),
    (body(decay="exponential"), "/learning_rate/decay"),
    (body(decay="cosine", min_lr=0.5), "/learning_rate/min_lr"),  # above the peak lr 0.2
    (body(min_lr=-1), "/learning_rate/min_lr"),
    (body(warmup_start_lr=0.5), "/learning_rate/warmup_start_lr"),  # above the peak
    (body(warmup_start_lr=-0.1), "/learning_rate/warmup_start_lr"),
    (body(warmup_epochs=95), "/learning_rate/warmup_epochs"),  # longer than the 90 epochs
    (body(warmup_epochs=None, warmup_steps=300000), "/learning_rate/warmup_steps"),
    (body(decay="step", milestones=[60000, 30000]), "/learning_rate/milestones/1"),  # out of order
    (body(decay="step", milestones=[100, 30000]), "/learning_rate/milestones/0"),  # inside the warmup
    (body(decay="step", milestones=[300000]), "/learning_rate/milestones/0"),  # after the run
    (body(decay="step", milestones=[0]), "/learning_rate/milestones/0"),
    (body(decay="step"), "/learning_rate/milestones"),
    (body(decay="cosine", milestones=[30000]), "/learning_rate/milestones"),
    (body(decay="step", milestones=[30000], milestone_epochs=[30]), "/learning_rate/milestone_epochs"),
    (body(decay="step", milestones=[30000], gamma=1.5), "/learning_rate/gamma"),
    (body(train_steps=1_000_000), "/learning_rate/train_steps"),  # longer than the epochs
    (body(train_steps=1000, train_samples=512000), "/learning_rate/train_samples"),
    (body(train_samples=100), "/learning_rate/train_samples"),  # not one global batch
    (body(optimizer="adamw", momentum=0.9), "/learning_rate/momentum"),
    (body(momentum=1.0), "/learning_rate/momentum"),
    (body(momentum=0.0, nesterov=True), "/learning_rate/nesterov"),
    (body(optimizer="adam", nesterov=True), "/learning_rate/nesterov"),
    (body(max_grad_norm=0), "/learning_rate/max_grad_norm"),
    (body(max_grad_norm=-1.0), "/learning_rate/max_grad_norm"),
    (
        {**body(decay="cosine"), "dataset": None, "learning_rate": {"base_lr": 0.1, "decay": "cosine"}},
        "/learning_rate/decay",
    ),
    (
        {
            **body(),
            "dataset": None,
            "learning_rate": {"base_lr": 0.1, "decay": "step", "milestone_epochs": [30]},
        },
        "/learning_rate/milestone_epochs",
    ),
]


@pytest.mark.parametrize(("request_body", "pointer"), WRONG)
def test_recipe_limits_are_422_at_the_field_and_the_values_offered_work(
    client: TestClient, request_body: dict[str, Any], pointer: str
) -> None:
    response = client.post("/v1/plans", json=request_body)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["errors"][0]["pointer"] == pointer, problem
    field = pointer.split("/")[2]
    for name, values in problem.get("suggestions", {}).items():
        fixed = put(request_body, name, values[0])
        assert client.post("/v1/plans", json=fixed).status_code == 200, (name, values)
    # A limit set by another value names it: "from 0 to the peak learning rate 0.2" works.
    named = re.search(r"from 0 to the peak learning rate ([0-9.e-]+)", problem["detail"])
    if named:
        fixed = {**request_body, "learning_rate": {**request_body["learning_rate"], field: float(named[1])}}
        assert client.post("/v1/plans", json=fixed).status_code == 200


RECIPE = {
    "base_lr": 0.1,
    "rule": "linear",
    "warmup_epochs": 5,
    "warmup_start_lr": 0.0,
    "decay": "step",
    "milestone_epochs": [30, 60, 80],
    "weight_decay": 0.0001,
    "max_grad_norm": 2.0,
}


def test_the_plan_states_its_recipe_and_the_schedule_follows_it(client: TestClient) -> None:
    plan = client.post("/v1/plans", json={**BASE, "learning_rate": RECIPE})
    assert plan.status_code == 200, plan.text
    lr = plan.json()["learning_rate"]
    # Goyal et al.'s ImageNet recipe: x0.1 at epochs 30, 60 and 80 of 2503 steps each.
    assert lr["milestones"] == [30 * 2503, 60 * 2503, 80 * 2503] and lr["train_steps"] == 90 * 2503
    assert (lr["decay"], lr["gamma"], lr["momentum"], lr["nesterov"]) == ("step", 0.1, 0.9, False)
    assert (lr["weight_decay"], lr["max_grad_norm"], lr["warmup_start_lr"]) == (0.0001, 2.0, 0.0)
    assert lr["schedule"].startswith("linear warmup from 0.0 to 0.2 over 12515 optimizer steps, then 0.2")
    schedule = client.post("/v1/plans/schedule", json={"plan": {**BASE, "learning_rate": RECIPE}})
    assert schedule.status_code == 200, schedule.text
    answer = schedule.json()
    points = {p["step"]: p["lr"] for p in answer["points"]}
    assert answer["decay"] == "step" and answer["schedule"] == lr["schedule"]
    assert points[0] == 0.0 and points[12515] == lr["lr_at_warmup_end"] == 0.2
    assert points[90 * 2503 - 1] == lr["lr_at_last_step"] == pytest.approx(0.2 * 0.1**3)
    assert answer["milestones"] == lr["milestones"]


def test_the_schedules_own_fields_replace_the_recipes_in_its_answer(client: TestClient) -> None:
    plan = {**BASE, "learning_rate": {**RECIPE, "decay": "cosine", "milestone_epochs": None}}
    answer = client.post("/v1/plans/schedule", json={"plan": plan}).json()
    assert answer["decay"] == "cosine" and answer["points"][-1]["lr"] == 0.0
    linear = client.post("/v1/plans/schedule", json={"plan": plan, "decay": "linear", "min_lr": 0.02}).json()
    assert (linear["decay"], linear["min_lr"], linear["points"][-1]["lr"]) == ("linear", 0.02, 0.02)
    short = client.post("/v1/plans/schedule", json={"plan": plan, "train_steps": 100})
    assert short.status_code == 422 and short.json()["errors"][0]["pointer"] == "/train_steps"
    (fix,) = short.json()["suggestions"]["train_steps"]
    assert client.post("/v1/plans/schedule", json={"plan": plan, "train_steps": fix}).status_code == 200
    too_high = client.post("/v1/plans/schedule", json={"plan": plan, "min_lr": 1.0})
    assert too_high.status_code == 422 and too_high.json()["errors"][0]["pointer"] == "/min_lr"


def test_a_warmup_that_changes_nothing_is_a_warning(client: TestClient) -> None:
    flat = {"base_lr": 0.0003, "base_batch_size": 512, "rule": "none", "warmup_steps": 2000}
    warnings = client.post("/v1/plans", json={**BASE, "learning_rate": flat}).json()["warnings"]
    assert any("the warmup changes nothing" in w for w in warnings), warnings
    real = client.post("/v1/plans", json={**BASE, "learning_rate": {**flat, "warmup_start_lr": 0}}).json()
    assert not any("changes nothing" in w for w in real["warnings"])
    assert real["learning_rate"]["schedule"].startswith("linear warmup from 0.0 to 0.0003")


def test_the_sampler_says_what_becomes_of_an_epochs_leftover_micro_batches(client: TestClient) -> None:
    # 15 micro-batches of 2 an epoch, accumulation 4: 3 optimizer steps and 3 left over.
    leftover = {
        "topology": {"num_nodes": 1, "gpus_per_node": 1},
        "global_batch_size": 8,
        "micro_batch_size": 2,
        "dataset": {"num_samples": 30, "epochs": 2},
    }
    sampler = client.post("/v1/plans", json=leftover).json()["sampler"]
    assert (sampler["optimizer_steps_per_epoch"], sampler["leftover_micro_steps"]) == (3, 3)
    assert sampler["leftover"] == "dropped"


def test_the_charts_title_says_what_the_warmup_does() -> None:
    from app.charts import lr_title
    from app.core.learning_rate.schedule import schedule
    from app.core.planner import plan
    from app.core.records.schedule import ScheduleSpec
    from app.schemas.plan_requests import PlanRequestIn

    def title(**lr: Any) -> str:
        request = {**BASE, "learning_rate": {"base_lr": 0.0003, "base_batch_size": 512, "rule": "none", **lr}}
        return lr_title(schedule(plan(PlanRequestIn.model_validate(request).to_core()), ScheduleSpec()))

    assert title(warmup_steps=2000, decay="cosine") == (
        "cosine decay to 0 (the warmup starts at the peak lr: it changes nothing)"
    )
    assert title(warmup_steps=2000, warmup_start_lr=0, decay="cosine") == (
        "linear warmup from 0, then cosine decay to 0"
    )
    assert title(decay="step", milestones=[1000]) == "no warmup, step decay at the milestones"


# A warmup that changes nothing, a floor no decay reaches, and an epoch DistributedSampler pads.
WARNED = {
    **BASE,
    "learning_rate": {
        "base_lr": 3e-4,
        "base_batch_size": 512,
        "rule": "none",
        "warmup_steps": 2000,
        "min_lr": 1e-5,
    },
}


def _chart_warnings(response: Any) -> list[str]:
    import json

    assert response.status_code == 200, response.text
    return list(json.loads(response.headers["batchplan-warnings"]))


def test_every_answer_about_a_plan_carries_its_one_list_of_warnings(client: TestClient) -> None:
    warnings = client.post("/v1/plans", json=WARNED).json()["warnings"]
    assert any("changes nothing" in w for w in warnings) and any(
        "min_lr has no effect" in w for w in warnings
    )
    assert any("padded" in w or "pads" in w for w in warnings), warnings
    assert client.post("/v1/plans/schedule", json={"plan": WARNED}).json()["warnings"] == warnings
    for fmt in ("png", "svg"):
        assert (
            _chart_warnings(client.post(f"/v1/plans/schedule?format={fmt}", json={"plan": WARNED}))
            == warnings
        )
    # The schedule's own decay reaches min_lr: that warning is not about this answer's recipe.
    cosine = client.post("/v1/plans/schedule", json={"plan": WARNED, "decay": "cosine"}).json()["warnings"]
    assert cosine == [w for w in warnings if not w.startswith("min_lr has no effect")]
    # And a floor the schedule sets where its decay does not reach it is warned in its answer.
    plain = {**WARNED, "learning_rate": {**WARNED["learning_rate"], "min_lr": None}}
    plain_warnings = client.post("/v1/plans", json=plain).json()["warnings"]
    floor = client.post("/v1/plans/schedule", json={"plan": plain, "min_lr": 1e-5}).json()["warnings"]
    assert floor == [
        *plain_warnings,
        "min_lr has no effect with decay constant: only cosine and linear decay end there",
    ]
