"""POST /v1/plans with a measured gradient noise scale: the plan's `efficiency` object."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

PROBLEM = "application/problem+json"
TOPOLOGY = {"num_nodes": 2, "gpus_per_node": 8}
EFFICIENCY_FIELDS = {
    "batch_size",
    "gradient_noise_scale",
    "gradient_noise_scale_stderr",
    "critical_batch_size",
    "batch_to_critical",
    "steps_vs_min",
    "samples_vs_min",
    "step_efficiency",
    "sample_efficiency",
    "verdict",
    "recommendation",
}
# Requests of every kind the planner answers, none of them with a noise scale.
REQUESTS: list[dict[str, Any]] = [
    {"topology": TOPOLOGY, "global_batch_size": 512},
    {"topology": TOPOLOGY, "micro_batch_size": 4, "gradient_accumulation_steps": 8},
    {"topology": TOPOLOGY, "global_batch_size": 1000, "micro_batch_size": 32, "divisibility": "round_down"},
    {
        "topology": TOPOLOGY,
        "global_batch_size": 100,
        "divisibility": "balance",
        "dataset": {"num_samples": 1000},
    },
    {
        "topology": {
            "node_groups": [
                {"name": "h100", "num_nodes": 2, "gpus_per_node": 8, "relative_throughput": 2.0},
                {"name": "a100", "num_nodes": 1, "gpus_per_node": 4, "relative_throughput": 1.0},
            ]
        },
        "global_batch_size": 1000,
        "dataset": {"num_samples": 100000, "epochs": 3},
        "learning_rate": {"base_lr": 3e-4, "optimizer": "adamw", "warmup_epochs": 1},
    },
]


def post(client: TestClient, body: dict[str, Any]) -> Any:
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


def plan_with(client: TestClient, **fields: Any) -> Any:
    """The plan for TOPOLOGY with `fields`."""
    return post(client, {"topology": TOPOLOGY, **fields})


def assert_field_error(response: Any, pointer: str) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].split(";")[0] == PROBLEM
    body: dict[str, Any] = response.json()
    assert {"type", "title", "status", "detail"} <= set(body) and body["status"] == 422
    assert body["errors"][0]["pointer"] == pointer, body["errors"]
    assert body["errors"][0]["detail"]
    return body


def test_efficiency_of_a_batch_below_the_critical_one(client: TestClient) -> None:
    body = plan_with(
        client, global_batch_size=512, gradient_noise_scale=4096, gradient_noise_scale_stderr=300
    )
    e = body["efficiency"]
    assert set(e) == EFFICIENCY_FIELDS
    assert e["batch_size"] == 512
    assert e["gradient_noise_scale"] == 4096.0 and e["gradient_noise_scale_stderr"] == 300.0
    assert e["critical_batch_size"] == 4096.0
    assert e["batch_to_critical"] == 0.125
    assert e["steps_vs_min"] == 9.0 and e["samples_vs_min"] == 1.125
    assert e["step_efficiency"] == 1 / 9 and e["sample_efficiency"] == 1 / 1.125
    assert (e["steps_vs_min"] - 1) * (e["samples_vs_min"] - 1) == 1.0
    assert e["verdict"] == "below_critical"
    assert "4096 +/- 300" in e["recommendation"]
    # A warning, and a line of the explanation, with the same numbers.
    warnings = [w for w in body["warnings"] if "critical batch" in w]
    assert len(warnings) == 1 and "0.125x" in warnings[0] and "9x the fewest" in warnings[0]
    lines = [line for line in body["explanation"] if "gradient noise scale" in line]
    assert len(lines) == 1 and "McCandlish" in lines[0] and "4096 +/- 300" in lines[0]


def test_efficiency_above_and_near_the_critical_batch(client: TestClient) -> None:
    above = plan_with(client, global_batch_size=65536, gradient_noise_scale=4096)
    e = above["efficiency"]
    assert e["verdict"] == "above_critical" and e["batch_to_critical"] == 16.0
    assert e["samples_vs_min"] == 17.0 and e["steps_vs_min"] == 1.0625
    assert e["gradient_noise_scale_stderr"] is None
    assert any(
        "16x the critical batch" in w and "17x the fewest possible samples" in w for w in above["warnings"]
    )

    near = plan_with(client, global_batch_size=4096, gradient_noise_scale=2048.5)
    assert near["efficiency"]["verdict"] == "near_critical"
    assert near["efficiency"]["gradient_noise_scale"] == 2048.5
    assert not any("critical batch" in w for w in near["warnings"])
    assert any("gradient noise scale" in line for line in near["explanation"])


def test_efficiency_is_null_without_a_noise_scale(client: TestClient) -> None:
    for request in REQUESTS:
        body = post(client, request)
        assert "efficiency" in body and body["efficiency"] is None
        assert not any("critical batch" in w for w in body["warnings"])
        assert not any("noise scale" in line for line in body["explanation"])
    explicit = post(
        client, {**REQUESTS[0], "gradient_noise_scale": None, "gradient_noise_scale_stderr": None}
    )
    assert explicit == post(client, REQUESTS[0])


@pytest.mark.parametrize("request_body", REQUESTS, ids=range(len(REQUESTS)))
def test_requests_without_the_field_are_answered_as_before(
    client: TestClient, request_body: dict[str, Any]
) -> None:
    """The whole response is the plan computed by the core for the request, with only the
    new `efficiency: null`; and the noise scale adds its object, one warning at most and one
    explanation line, changing nothing else."""
    from app.core.planner import plan
    from app.schemas.plan_requests import PlanRequestIn
    from app.schemas.plan_responses import PlanOut

    before = post(client, request_body)
    expected = PlanOut.model_validate(plan(PlanRequestIn.model_validate(request_body).to_core()))
    assert before == expected.model_dump(mode="json")
    # Byte for byte, as the served JSON is written straight from the dataclass.
    raw = client.post("/v1/plans", json=request_body).content
    assert raw == expected.model_dump_json().encode()

    after = post(client, {**request_body, "gradient_noise_scale": 100.0})
    assert after["efficiency"]["batch_size"] == before["global_batch_size"]
    stripped = copy.deepcopy(after)
    stripped["efficiency"] = None
    extra_warnings = [w for w in after["warnings"] if w not in before["warnings"]]
    assert len(extra_warnings) <= 1
    stripped["warnings"] = [w for w in after["warnings"] if w not in extra_warnings]
    assert after["explanation"][: len(before["explanation"])] == before["explanation"]
    assert len(after["explanation"]) == len(before["explanation"]) + 1
    stripped["explanation"] = before["explanation"]
    assert stripped == before


def test_efficiency_uses_the_global_batch_after_rounding(client: TestClient) -> None:
    body = plan_with(
        client,
        global_batch_size=1000,
        micro_batch_size=32,
        divisibility="round_up",
        gradient_noise_scale=1024,
    )
    assert body["requested_global_batch_size"] == 1000 and body["global_batch_size"] == 1024
    e = body["efficiency"]
    assert e["batch_size"] == 1024 and e["batch_to_critical"] == 1.0
    assert (e["steps_vs_min"], e["samples_vs_min"]) == (2.0, 2.0)
    assert e["verdict"] == "near_critical"


def test_efficiency_uses_the_inferred_global_batch(client: TestClient) -> None:
    body = plan_with(client, micro_batch_size=4, gradient_accumulation_steps=2, gradient_noise_scale=64)
    assert body["global_batch_size"] == 4 * 2 * 16
    assert body["efficiency"]["batch_size"] == 128 and body["efficiency"]["batch_to_critical"] == 2.0


def test_a_whole_number_and_its_float_give_the_same_plan(client: TestClient) -> None:
    a = plan_with(client, global_batch_size=512, gradient_noise_scale=4096)
    b = plan_with(client, global_batch_size=512, gradient_noise_scale=4096.0)
    assert a == b


def test_a_zero_stderr_is_accepted(client: TestClient) -> None:
    body = plan_with(client, global_batch_size=512, gradient_noise_scale=512, gradient_noise_scale_stderr=0)
    assert body["efficiency"]["gradient_noise_scale_stderr"] == 0.0


WRONG_VALUES: list[tuple[dict[str, Any], str]] = [
    ({"gradient_noise_scale": 0}, "/gradient_noise_scale"),
    ({"gradient_noise_scale": 0.0}, "/gradient_noise_scale"),
    ({"gradient_noise_scale": -4096}, "/gradient_noise_scale"),
    ({"gradient_noise_scale": -1e-9}, "/gradient_noise_scale"),
    ({"gradient_noise_scale": "4096"}, "/gradient_noise_scale"),
    ({"gradient_noise_scale": "NaN"}, "/gradient_noise_scale"),
    ({"gradient_noise_scale": "nan"}, "/gradient_noise_scale"),
    ({"gradient_noise_scale": "Infinity"}, "/gradient_noise_scale"),
    ({"gradient_noise_scale": "inf"}, "/gradient_noise_scale"),
    ({"gradient_noise_scale": True}, "/gradient_noise_scale"),
    ({"gradient_noise_scale": False}, "/gradient_noise_scale"),
    ({"gradient_noise_scale": [4096]}, "/gradient_noise_scale"),
    ({"gradient_noise_scale": {"value": 4096}}, "/gradient_noise_scale"),
    ({"gradient_noise_scale": 10**400}, "/gradient_noise_scale"),
    ({"gradient_noise_scale": 5e-324}, "/gradient_noise_scale"),  # B / B_noise overflows
    ({"gradient_noise_scale_stderr": 10}, "/gradient_noise_scale"),
    ({"gradient_noise_scale_stderr": 0}, "/gradient_noise_scale"),
    ({"gradient_noise_scale": None, "gradient_noise_scale_stderr": 10}, "/gradient_noise_scale"),
    ({"gradient_noise_scale": 4096, "gradient_noise_scale_stderr": -1}, "/gradient_noise_scale_stderr"),
    ({"gradient_noise_scale": 4096, "gradient_noise_scale_stderr": "NaN"}, "/gradient_noise_scale_stderr"),
    ({"gradient_noise_scale": 4096, "gradient_noise_scale_stderr": True}, "/gradient_noise_scale_stderr"),
    ({"gradient_noise_scale": 4096, "gradient_noise_scale_stderr": "300"}, "/gradient_noise_scale_stderr"),
    ({"gradient_noise_scale": 4096, "gradient_noise_scale_std": 300}, "/gradient_noise_scale_std"),
]


@pytest.mark.parametrize(("fields", "pointer"), WRONG_VALUES, ids=[json.dumps(f) for f, _ in WRONG_VALUES])
def test_bad_values_are_422_problems_naming_the_field(
    client: TestClient, fields: dict[str, Any], pointer: str
) -> None:
    body = {"topology": TOPOLOGY, "global_batch_size": 512, **fields}
    assert_field_error(client.post("/v1/plans", json=body), pointer)


def test_the_stderr_without_a_noise_scale_says_why(client: TestClient) -> None:
    body = {"topology": TOPOLOGY, "global_batch_size": 512, "gradient_noise_scale_stderr": 10}
    problem = assert_field_error(client.post("/v1/plans", json=body), "/gradient_noise_scale")
    assert "gradient_noise_scale_stderr" in problem["detail"]


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_json_tokens_are_rejected(client: TestClient, token: str) -> None:
    start = '{"topology": {"num_nodes": 2, "gpus_per_node": 8}, "global_batch_size": 512, '
    bodies = {
        "gradient_noise_scale": start + f'"gradient_noise_scale": {token}}}',
        "gradient_noise_scale_stderr": start
        + f'"gradient_noise_scale": 4096, "gradient_noise_scale_stderr": {token}}}',
    }
    for field, raw in bodies.items():
        response = client.post("/v1/plans", content=raw, headers={"content-type": "application/json"})
        assert_field_error(response, f"/{field}")


def test_openapi_documents_the_fields_and_an_example(client: TestClient) -> None:
    openapi = client.get("/openapi.json").json()
    schemas = openapi["components"]["schemas"]
    request = schemas["PlanRequestIn"]
    noise = request["properties"]["gradient_noise_scale"]
    assert {"type": "number", "exclusiveMinimum": 0} in noise["anyOf"] and noise["description"]
    assert {"type": "number", "minimum": 0} in request["properties"]["gradient_noise_scale_stderr"]["anyOf"]
    assert request["then"]["required"] == ["gradient_noise_scale"]
    out = schemas["EfficiencyOut"]
    assert set(out["properties"]) == EFFICIENCY_FIELDS
    assert out["properties"]["verdict"]["enum"] == ["near_critical", "above_critical", "below_critical"]
    operation = openapi["paths"]["/v1/plans"]["post"]
    examples = operation["requestBody"]["content"]["application/json"]["examples"]
    with_noise = [name for name, ex in examples.items() if "gradient_noise_scale" in ex["value"]]
    assert with_noise
    responses = operation["responses"]["200"]["content"]["application/json"]["examples"]
    for name in with_noise:
        efficiency = responses[name]["value"]["efficiency"]
        assert efficiency is not None and set(efficiency) == EFFICIENCY_FIELDS
        # The OpenAPI document leaves out nulls (FastAPI writes it with exclude_none).
        assert without_nulls(post(client, examples[name]["value"])) == responses[name]["value"]


def without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value
