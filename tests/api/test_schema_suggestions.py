"""Suggestions on schema errors are tried before they are given: each suggested value,
substituted alone into the request as sent, plans (the contract's rule for every suggestion)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.apps import fake_client

SIXTEEN = {"num_nodes": 2, "gpus_per_node": 8}
MIXED = {
    "node_groups": [
        {
            "name": "h100",
            "num_nodes": 1,
            "gpus_per_node": 8,
            "relative_throughput": 2.0,
            "max_micro_batch_size": 8,
        },
        {"name": "a100", "num_nodes": 1, "gpus_per_node": 4, "max_micro_batch_size": 4},
    ]
}
BAD_BODIES = [
    {"topology": SIXTEEN, "global_batch_size": -5},  # the bound, 1, cannot feed 16 replicas
    {"topology": SIXTEEN, "global_batch_size": 0, "micro_batch_size": 32},
    {"topology": SIXTEEN, "global_batch_size": 512.5},
    {"topology": SIXTEEN, "global_batch_size": 2**60},
    {"topology": SIXTEEN, "global_batch_size": 512, "micro_batch_size": 0},
    {"topology": SIXTEEN, "global_batch_size": 512, "gradient_accumulation_steps": -2},
    {"topology": SIXTEEN, "global_batch_size": 512, "max_micro_batch_size": 0},
    {"topology": {"num_nodes": 0, "gpus_per_node": 8}, "global_batch_size": 512},
    {"topology": {"num_nodes": 3, "gpus_per_node": 0}, "global_batch_size": 24},
    {"topology": SIXTEEN, "global_batch_size": 512, "parallelism": {"tensor": 0}},
    {"topology": MIXED, "global_batch_size": -1},
    {"topology": MIXED, "global_batch_size": 100, "gradient_accumulation_steps": 0},
    {"topology": {"node_groups": [{"num_nodes": 0, "gpus_per_node": 4}]}, "global_batch_size": 8},
    {"topology": SIXTEEN, "global_batch_size": 64, "dataset": {"num_samples": 0}},
]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    yield from fake_client(tmp_path_factory)


def _substituted(body: dict[str, Any], pointer: str, value: int) -> dict[str, Any]:
    fixed = copy.deepcopy(body)
    *path, last = pointer.strip("/").split("/")
    node: Any = fixed
    for part in path:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[last] = value
    return fixed


@pytest.mark.parametrize("body", BAD_BODIES)
@pytest.mark.parametrize("where", ["/v1/plans", "/v1/plans/schedule", "/v1/checks"])
def test_every_suggestion_on_a_schema_error_plans_when_substituted_alone(
    client: TestClient, body: dict[str, Any], where: str
) -> None:
    nested = where != "/v1/plans"
    response = client.post(where, json={"plan": body} if nested else body)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["type"].endswith("validation-error")
    pointer = problem["errors"][0]["pointer"]
    if nested:
        assert pointer.startswith("/plan/")
        pointer = pointer.removeprefix("/plan")
    # The key is the field's path in the plan request: /topology/num_nodes -> topology.num_nodes.
    values = problem.get("suggestions", {}).get(pointer.strip("/").replace("/", "."), [])
    assert values, f"no working value suggested for {pointer}"
    for value in values:
        fixed = client.post("/v1/plans", json=_substituted(body, pointer, value))
        assert fixed.status_code == 200, (pointer, value, fixed.text)


def test_an_unworkable_bound_is_replaced_by_values_that_plan(client: TestClient) -> None:
    problem = client.post("/v1/plans", json=BAD_BODIES[0]).json()
    assert problem["suggestions"] == {"global_batch_size": [16, 32]}  # never [1]: 1 sample, 16 replicas


def test_no_suggestion_when_no_single_value_repairs_the_request(client: TestClient) -> None:
    two_errors = {"topology": SIXTEEN, "global_batch_size": -5, "micro_batch_size": -1}
    problem = client.post("/v1/plans", json=two_errors).json()
    assert problem["status"] == 422 and "suggestions" not in problem
