"""POST /v1/plans over HTTP: the CONTRACT.md example, OpenAPI examples, and HTTP-level invariants."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from app.schemas.examples import plan_example
from app.schemas.plan_recipe_out import LearningRateOut
from app.schemas.plan_responses import ReplicaGroupOut, SamplerOut

# The ImageNet example of Swagger, every default spelled out as CONTRACT.md sends it.
IMAGENET_REQUEST: dict[str, Any] = {
    **plan_example("dataset_and_lr"),
    "micro_batch_size": None,
    "gradient_accumulation_steps": None,
    "max_micro_batch_size": None,
    "divisibility": "exact",
    "parallelism": {"tensor": 1, "pipeline": 1, "context": 1},
    "loss_reduction": "mean",
}


def swagger_example(model: type[BaseModel]) -> Any:
    """The one example Swagger shows for `model` (app.schemas.types.with_examples)."""
    (example,) = model.model_config["json_schema_extra"]["examples"]  # type: ignore[index]
    return example


# The response of CONTRACT.md, field by field (its `explanation` is elided there).
CONTRACT_RESPONSE: dict[str, Any] = {
    "world_size": 16,
    "model_parallel_size": 1,
    "data_parallel_size": 16,
    "requested_global_batch_size": 512,
    "global_batch_size": 512,
    "micro_batch_size": 32,
    "gradient_accumulation_steps": 1,
    # The replica group, sampler and learning rate as Swagger shows them: the same ImageNet plan.
    "replica_groups": [swagger_example(ReplicaGroupOut)],
    "sampler": swagger_example(SamplerOut),
    "learning_rate": swagger_example(LearningRateOut),
}
CONTRACT_WARNING = "1 sample per epoch is seen twice: DistributedSampler pads 1281167 to 1281168"


def post_plan(client: TestClient, body: dict[str, Any]) -> Any:
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


def assert_contains(actual: Any, expected: Any, where: str = "") -> None:
    """Every field of `expected` is in `actual` with that value; extra fields are allowed."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), where
        for key, value in expected.items():
            assert key in actual, f"{where}/{key} is missing"
            assert_contains(actual[key], value, f"{where}/{key}")
    elif isinstance(expected, list) and expected and isinstance(expected[0], dict):
        assert isinstance(actual, list) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_contains(a, e, f"{where}/{i}")
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def test_contract_example_is_reproduced_field_by_field(client: TestClient) -> None:
    body = post_plan(client, IMAGENET_REQUEST)
    assert_contains(body, CONTRACT_RESPONSE)
    # Further warnings may be added (a short last micro-batch is worth one); this one must be there.
    assert CONTRACT_WARNING in body["warnings"]
    assert isinstance(body["explanation"], list) and body["explanation"]
    assert all(isinstance(line, str) and line for line in body["explanation"])


def test_only_topology_and_one_batch_field_are_required(client: TestClient) -> None:
    body = post_plan(client, {"topology": {"num_nodes": 2, "gpus_per_node": 8}, "global_batch_size": 512})
    assert (body["micro_batch_size"], body["gradient_accumulation_steps"]) == (32, 1)
    assert body["sampler"] is None and body["learning_rate"] is None
    body = post_plan(client, {"topology": {"num_nodes": 2, "gpus_per_node": 8}, "micro_batch_size": 4})
    assert (body["global_batch_size"], body["gradient_accumulation_steps"]) == (64, 1)
    assert body["requested_global_batch_size"] is None


def test_mixed_cluster_example_splits_by_throughput_within_caps(client: TestClient) -> None:
    # h100: 2 nodes x 8, throughput 2, cap 64; a100: 1 node x 4, cap 32; batch 1000.
    body = post_plan(client, plan_example("mixed"))
    assert body["world_size"] == 20 and body["data_parallel_size"] == 20
    groups = body["replica_groups"]
    assert groups[0]["start"] == 0 and groups[-1]["stop"] == 20
    samples = sum((g["stop"] - g["start"]) * g["samples_per_step"] for g in groups)
    assert samples == body["global_batch_size"] == 1000
    for group in groups:
        cap = 64 if group["node_group"] == "h100" else 32
        assert 1 <= group["micro_batch_size"] <= cap
        expected_scale = 20 * group["micro_batch_size"] / 1000
        assert group["loss_scale"] == expected_scale
    h100 = [g["micro_batch_size"] for g in groups if g["node_group"] == "h100"]
    a100 = [g["micro_batch_size"] for g in groups if g["node_group"] == "a100"]
    assert min(h100) > max(a100)
    assert body["sampler"]["kind"] == "proportional"
    if len({g["micro_batch_size"] for g in groups}) > 1:
        assert body["micro_batch_size"] is None


def test_sum_reduction_scales_by_replicas_over_global(client: TestClient) -> None:
    body = post_plan(
        client,
        {"topology": {"num_nodes": 2, "gpus_per_node": 8}, "global_batch_size": 512, "loss_reduction": "sum"},
    )
    assert [g["loss_scale"] for g in body["replica_groups"]] == [16 / 512]


def test_numbers_at_the_integer_limit_survive_json(client: TestClient) -> None:
    limit = 2**53 - 1
    body = post_plan(
        client,
        {
            "topology": {"num_nodes": 1, "gpus_per_node": 1},
            "global_batch_size": limit,
            "dataset": {"num_samples": limit},
        },
    )
    assert body["global_batch_size"] == limit
    assert body["sampler"]["total_size"] == limit


def test_round_down_echoes_the_request_and_warns(client: TestClient) -> None:
    body = post_plan(
        client,
        {
            "topology": {"num_nodes": 2, "gpus_per_node": 8},
            "global_batch_size": 1000,
            "micro_batch_size": 32,
            "divisibility": "round_down",
        },
    )
    assert body["requested_global_batch_size"] == 1000
    assert body["global_batch_size"] == 512
    assert any("1000" in w and "512" in w for w in body["warnings"])


# ------------------------------------------------------------------------------ OpenAPI


@pytest.fixture
def openapi(client: TestClient) -> dict[str, Any]:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    return response.json()


def plan_operation(openapi: dict[str, Any]) -> dict[str, Any]:
    return openapi["paths"]["/v1/plans"]["post"]


def request_examples(openapi: dict[str, Any]) -> dict[str, Any]:
    content = plan_operation(openapi)["requestBody"]["content"]["application/json"]
    return content.get("examples", {})


def test_openapi_has_homogeneous_mixed_and_dataset_lr_examples(openapi: dict[str, Any]) -> None:
    values = [example["value"] for example in request_examples(openapi).values()]
    assert any("num_nodes" in v["topology"] and "dataset" not in v for v in values), "no homogeneous example"
    assert any("node_groups" in v["topology"] for v in values), "no mixed-cluster example"
    assert any("dataset" in v and "learning_rate" in v for v in values), "no dataset + learning-rate example"


def test_every_openapi_request_example_is_accepted(client: TestClient, openapi: dict[str, Any]) -> None:
    examples = request_examples(openapi)
    assert len(examples) >= 3
    for name, example in examples.items():
        response = client.post("/v1/plans", json=example["value"])
        assert response.status_code == 200, f"example {name!r}: {response.text}"


def test_openapi_documents_the_422_problem(openapi: dict[str, Any]) -> None:
    responses = plan_operation(openapi)["responses"]
    assert "422" in responses
    content = responses["422"]["content"]
    assert "application/problem+json" in content
    problem = content["application/problem+json"]
    schema = problem.get("schema", {})
    ref = schema.get("$ref", "")
    assert ref, "the 422 response names no schema"
    component = openapi["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert {"type", "title", "status", "detail"} <= set(component["properties"])
    example = problem.get("example") or next(iter(problem.get("examples", {}).values()), {}).get("value")
    assert example and example["status"] == 422


def test_the_served_json_is_exactly_the_documented_model() -> None:
    """/v1/plans writes its JSON straight from the core dataclass (plan_json) for speed; it
    must be byte for byte what the documented PlanOut model would write."""
    from app.core.planner import plan
    from app.schemas.examples import PLAN_EXAMPLES
    from app.schemas.plan_requests import PlanRequestIn
    from app.schemas.plan_responses import PlanOut, plan_json

    bodies = [example["value"] for example in PLAN_EXAMPLES.values()] + [
        {
            "topology": {"num_nodes": 2, "gpus_per_node": 8},
            "global_batch_size": 100,
            "divisibility": "balance",
            "dataset": {"num_samples": 1000, "drop_last": True},
            "learning_rate": {"base_lr": 1e-3, "optimizer": "adam", "warmup_epochs": 0.5},
        },
    ]
    for body in bodies:
        result = plan(PlanRequestIn.model_validate(body).to_core())
        assert plan_json(result) == PlanOut.model_validate(result).model_dump_json().encode()
