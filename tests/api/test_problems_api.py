"""Every error path of POST /v1/plans is a 4xx RFC 9457 problem naming the field; never a 500
(malformed bodies and unknown routes: test_malformed_requests.py)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.problems import TOPOLOGY, assert_field_error, assert_problem, base, post_raw

LIMIT = 2**53 - 1


def test_whole_numbers_written_as_floats_are_counts(client: TestClient) -> None:
    # JSON Schema's "integer" admits 2.0, and the OpenAPI schema says "integer".
    body = {"topology": {"num_nodes": 2.0, "gpus_per_node": 8}, "global_batch_size": 512.0}
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["global_batch_size"] == 512 and response.json()["world_size"] == 16


WRONG_VALUES = [
    # (request body, pointer of the field at fault)
    (base(global_batch_size="512"), "/global_batch_size"),
    (base(global_batch_size=True), "/global_batch_size"),
    (base(global_batch_size=512.5), "/global_batch_size"),
    (base(global_batch_size=0), "/global_batch_size"),
    (base(global_batch_size=-16), "/global_batch_size"),
    (base(global_batch_size=LIMIT + 1), "/global_batch_size"),
    (base(global_batch_size=10**400), "/global_batch_size"),
    (base(micro_batch_size=0), "/micro_batch_size"),
    (base(micro_batch_size=False), "/micro_batch_size"),
    (base(gradient_accumulation_steps=-1), "/gradient_accumulation_steps"),
    (base(gradient_accumulation_steps="2"), "/gradient_accumulation_steps"),
    (base(max_micro_batch_size=0), "/max_micro_batch_size"),
    ({"topology": {"num_nodes": "2", "gpus_per_node": 8}, "global_batch_size": 512}, "/topology/num_nodes"),
    ({"topology": {"num_nodes": 2, "gpus_per_node": 0}, "global_batch_size": 512}, "/topology/gpus_per_node"),
    ({"topology": {"num_nodes": True, "gpus_per_node": 8}, "global_batch_size": 512}, "/topology/num_nodes"),
    ({"topology": {"num_nodes": 2.5, "gpus_per_node": 8}, "global_batch_size": 512}, "/topology/num_nodes"),
    (base(parallelism={"tensor": 0}), "/parallelism/tensor"),
    (base(parallelism={"pipeline": "2"}), "/parallelism/pipeline"),
    (base(dataset={"num_samples": 0}), "/dataset/num_samples"),
    (base(dataset={"num_samples": LIMIT + 1}), "/dataset/num_samples"),
    (base(dataset={"num_samples": 100, "seed": -1}), "/dataset/seed"),
    (base(dataset={"num_samples": 100, "shuffle": "yes"}), "/dataset/shuffle"),
    (base(dataset={"num_samples": 100, "drop_last": 1}), "/dataset/drop_last"),
    (base(learning_rate={"base_lr": 0}), "/learning_rate/base_lr"),
    (base(learning_rate={"base_lr": -0.1}), "/learning_rate/base_lr"),
    (base(learning_rate={"base_lr": 0.1, "base_batch_size": 0}), "/learning_rate/base_batch_size"),
    (base(learning_rate={"base_lr": 0.1, "optimizer": "rmsprop"}), "/learning_rate/optimizer"),
    (base(learning_rate={"base_lr": 0.1, "rule": "cubic"}), "/learning_rate/rule"),
    (base(learning_rate={"base_lr": 0.1, "warmup_epochs": -1}), "/learning_rate/warmup_epochs"),
    (base(learning_rate={"base_lr": 0.1, "betas": [0.9, 1.0]}), "/learning_rate/betas/1"),
    (base(divisibility="nearest"), "/divisibility"),
    (base(loss_reduction="max"), "/loss_reduction"),
    (base(unknown_field=1), "/unknown_field"),
    (base(dataset={"num_samples": 100, "colour": "red"}), "/dataset/colour"),
    ({"global_batch_size": 512}, "/topology"),
    ({"topology": {**TOPOLOGY, "node_groups": [TOPOLOGY]}, "global_batch_size": 512}, "/topology"),
    ({"topology": {"num_nodes": 2}, "global_batch_size": 512}, "/topology"),
    ({"topology": {"node_groups": []}, "global_batch_size": 512}, "/topology/node_groups"),
    (
        {
            "topology": {"node_groups": [{"num_nodes": 1, "gpus_per_node": 1, "relative_throughput": 0}]},
            "global_batch_size": 4,
        },
        "/topology/node_groups/0/relative_throughput",
    ),
    (
        {
            "topology": {"node_groups": [{"num_nodes": 1, "gpus_per_node": 1, "relative_throughput": -1.5}]},
            "global_batch_size": 4,
        },
        "/topology/node_groups/0/relative_throughput",
    ),
]


@pytest.mark.parametrize(("body", "pointer"), WRONG_VALUES)
def test_wrong_values_are_422_problems_at_the_field(
    client: TestClient, body: dict[str, Any], pointer: str
) -> None:
    assert_field_error(client.post("/v1/plans", json=body), pointer)


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_throughputs_are_rejected(client: TestClient, token: str) -> None:
    group = '{"num_nodes": 1, "gpus_per_node": 2, "relative_throughput": ' + token + "}"
    raw = '{"topology": {"node_groups": [' + group + ']}, "global_batch_size": 4}'
    body = assert_problem(post_raw(client, raw), 422)
    assert body["errors"][0]["pointer"] == "/topology/node_groups/0/relative_throughput"


@pytest.mark.parametrize("token", ["NaN", "Infinity"])
def test_non_finite_learning_rates_are_rejected(client: TestClient, token: str) -> None:
    raw = '{"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 4, "learning_rate": '
    assert_field_error(post_raw(client, raw + '{"base_lr": ' + token + "}}"), "/learning_rate/base_lr")


def test_world_above_ten_million_gpus_is_rejected(client: TestClient) -> None:
    body = {"topology": {"num_nodes": 5000, "gpus_per_node": 5000}, "global_batch_size": 2**40}
    problem = assert_field_error(client.post("/v1/plans", json=body), "/topology/num_nodes")
    assert "10000000" in problem["detail"]
    # 2000 nodes of 5000 GPUs fit the limit, but 2^40 samples do not split over them: no suggestion.
    assert "suggestions" not in problem
    splits = {**body, "global_batch_size": 4 * 10_000_000}
    problem = assert_field_error(client.post("/v1/plans", json=splits), "/topology/num_nodes")
    assert problem["suggestions"] == {"topology.num_nodes": [10_000_000 // 5000]}
    fixed = {**splits, "topology": {"num_nodes": 10_000_000 // 5000, "gpus_per_node": 5000}}
    assert client.post("/v1/plans", json=fixed).status_code == 200


def test_world_at_ten_million_gpus_is_planned(client: TestClient) -> None:
    body = {"topology": {"num_nodes": 1_250_000, "gpus_per_node": 8}, "global_batch_size": 10_000_000}
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 200, response.text
    assert len(response.json()["replica_groups"]) == 1


def test_many_node_groups_past_the_gpu_limit_are_rejected(client: TestClient) -> None:
    groups = [{"num_nodes": 10_000_000, "gpus_per_node": 1} for _ in range(2)]
    body = {"topology": {"node_groups": groups}, "global_batch_size": 2**40}
    assert_field_error(client.post("/v1/plans", json=body), "/topology/node_groups")


def test_parallel_sizes_that_do_not_divide_the_world_suggest_sizes_and_gpu_counts(client: TestClient) -> None:
    response = client.post("/v1/plans", json=base(parallelism={"tensor": 3}))
    body = assert_problem(response, 422)
    assert body["errors"][0]["pointer"] == "/parallelism/tensor"
    assert "3" in body["detail"] and "16" in body["detail"]
    # Tensor sizes that divide the 16 GPUs, and node counts and GPUs per node that 3 divides.
    suggested = body["suggestions"]
    assert set(suggested) == {"parallelism.tensor", "topology.num_nodes", "topology.gpus_per_node"}
    assert all(16 % t == 0 for t in suggested["parallelism.tensor"])
    assert all(n * 8 % 3 == 0 for n in suggested["topology.num_nodes"])
    assert all(2 * g % 3 == 0 for g in suggested["topology.gpus_per_node"])
    for key, values in suggested.items():
        section, field = key.split(".")
        for value in values:
            fixed = base(parallelism={"tensor": 3})
            fixed[section] = {**fixed[section], field: value}
            assert client.post("/v1/plans", json=fixed).status_code == 200, (key, value)


@pytest.mark.parametrize(
    ("fields", "pointer"),
    [
        ({"global_batch_size": 8}, "/global_batch_size"),  # fewer samples than replicas
        ({"global_batch_size": 1000, "micro_batch_size": 32}, "/global_batch_size"),
        ({"micro_batch_size": 64, "max_micro_batch_size": 16}, "/micro_batch_size"),
        ({"gradient_accumulation_steps": 1, "max_micro_batch_size": 16}, "/global_batch_size"),
        ({"micro_batch_size": 8, "gradient_accumulation_steps": 3}, "/global_batch_size"),
        ({"learning_rate": {"base_lr": 0.1, "warmup_epochs": 5}}, "/learning_rate/warmup_epochs"),
        ({"global_batch_size": 8, "divisibility": "round_down"}, "/global_batch_size"),
    ],
)
def test_infeasible_values_are_422_with_working_suggestions(
    client: TestClient, fields: dict[str, Any], pointer: str
) -> None:
    request = base(**fields)
    body = assert_field_error(client.post("/v1/plans", json=request), pointer)
    for field, values in body.get("suggestions", {}).items():
        if field in ("global_batch_size", "micro_batch_size", "gradient_accumulation_steps"):
            for value in values:
                fixed = client.post("/v1/plans", json={**request, field: value})
                assert fixed.status_code == 200, f"suggested {field}={value}: {fixed.text}"


def test_neither_global_nor_micro_is_a_422(client: TestClient) -> None:
    assert_field_error(client.post("/v1/plans", json={"topology": TOPOLOGY}), "/global_batch_size")


def test_mixed_caps_that_cannot_hold_the_batch_are_rejected(client: TestClient) -> None:
    groups = [
        {
            "name": "a",
            "num_nodes": 1,
            "gpus_per_node": 2,
            "relative_throughput": 2.0,
            "max_micro_batch_size": 2,
        },
        {
            "name": "b",
            "num_nodes": 1,
            "gpus_per_node": 2,
            "relative_throughput": 1.0,
            "max_micro_batch_size": 1,
        },
    ]
    body = {"topology": {"node_groups": groups}, "global_batch_size": 7, "gradient_accumulation_steps": 1}
    assert_field_error(client.post("/v1/plans", json=body), "/global_batch_size")


def test_duplicate_node_group_names_are_rejected(client: TestClient) -> None:
    groups = [
        {"name": "x", "num_nodes": 1, "gpus_per_node": 2},
        {"name": "x", "num_nodes": 1, "gpus_per_node": 2},
    ]
    body = {"topology": {"node_groups": groups}, "global_batch_size": 8}
    assert_field_error(client.post("/v1/plans", json=body), "/topology/node_groups/1/name")
