"""Every error path of POST /v1/plans is a 4xx RFC 9457 problem naming the field; never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

PROBLEM = "application/problem+json"
TOPOLOGY = {"num_nodes": 2, "gpus_per_node": 8}
LIMIT = 2**53 - 1


def base(**fields: Any) -> dict[str, Any]:
    return {"topology": TOPOLOGY, "global_batch_size": 512, **fields}


def assert_problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].split(";")[0] == PROBLEM
    body = response.json()
    assert {"type", "title", "status", "detail"} <= set(body)
    assert body["status"] == status
    assert isinstance(body["type"], str) and body["type"]
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    return body


def assert_field_error(response: Any, pointer: str, status: int = 422) -> dict[str, Any]:
    body = assert_problem(response, status)
    assert body.get("errors"), "a field error lists the field in errors"
    assert body["errors"][0]["pointer"] == pointer, body["errors"]
    assert body["errors"][0]["detail"]
    return body


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


def post_raw(client: TestClient, content: bytes | str, content_type: str | None = "application/json") -> Any:
    headers = {"content-type": content_type} if content_type else {}
    return client.post("/v1/plans", content=content, headers=headers)


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


# --------------------------------------------------------------------- malformed bodies


def test_bad_json_is_400(client: TestClient) -> None:
    assert_problem(post_raw(client, b'{"topology": '), 400)


def test_bad_json_names_the_line_and_column_and_no_pointer(client: TestClient) -> None:
    raw = '{\n  "topology": {"num_nodes": 2, "gpus_per_node": 8}\n  "global_batch_size": 512\n}'
    body = assert_problem(post_raw(client, raw), 400)
    assert body["type"] == "urn:batchplan:problem:malformed-body"
    assert body["detail"] == "the body is not valid JSON: Expecting ',' delimiter at line 3, column 3"
    assert "errors" not in body  # a character offset is no JSON Pointer


def test_wrong_content_type_is_400(client: TestClient) -> None:
    response = post_raw(client, json.dumps(base()), "text/plain")
    body = assert_problem(response, 400)
    assert "application/json" in body["detail"]
    assert body["type"] == "urn:batchplan:problem:unsupported-media-type"
    assert body["title"] == "The request body is not JSON"
    # One serialisation for every problem: as compact as the planner's own 422s.
    assert response.content == json.dumps(body, separators=(",", ":")).encode()
    schema_error = client.post("/v1/plans", json=base(global_batch_size=0))
    assert schema_error.content == json.dumps(schema_error.json(), separators=(",", ":")).encode()


def test_form_content_type_is_400(client: TestClient) -> None:
    assert_problem(post_raw(client, "a=1", "application/x-www-form-urlencoded"), 400)


def test_missing_content_type_with_a_body_is_400(client: TestClient) -> None:
    assert_problem(post_raw(client, json.dumps(base()), None), 400)


def test_json_suffix_media_types_are_accepted(client: TestClient) -> None:
    assert post_raw(client, json.dumps(base()), "application/merge-patch+json").status_code == 200
    assert post_raw(client, json.dumps(base()), "application/json; charset=utf-8").status_code == 200


@pytest.mark.parametrize("depth", [50, 5_000, 200_000])
def test_deeply_nested_json_is_a_4xx_not_a_500(client: TestClient, depth: int) -> None:
    nested = "[" * depth + "]" * depth
    response = post_raw(client, '{"topology": ' + nested + ', "global_batch_size": 4}')
    assert 400 <= response.status_code < 500
    assert_problem(response, response.status_code)


def test_nested_object_in_a_known_field_is_rejected(client: TestClient) -> None:
    nested = "{" + '"a": {' * 10_000 + "}" * 10_001
    response = post_raw(
        client, '{"topology": {"num_nodes": 1, "gpus_per_node": 1}, "dataset": ' + nested + "}"
    )
    assert 400 <= response.status_code < 500
    assert_problem(response, response.status_code)


def test_body_over_the_limit_is_413(client: TestClient, settings: Any) -> None:
    padding = " " * (settings.max_body_bytes + 1)
    body = assert_problem(post_raw(client, json.dumps(base()) + padding), 413)
    assert str(settings.max_body_bytes) in body["detail"]


def test_body_just_under_the_limit_is_served(client: TestClient, settings: Any) -> None:
    text = json.dumps(base())
    padding = " " * (settings.max_body_bytes - len(text))
    assert post_raw(client, text + padding).status_code == 200


def test_streamed_body_over_the_limit_is_413(client: TestClient, settings: Any) -> None:
    def chunks() -> Any:
        yield json.dumps(base()).encode()
        for _ in range(settings.max_body_bytes // 65536 + 2):
            yield b" " * 65536

    response = client.post("/v1/plans", content=chunks(), headers={"content-type": "application/json"})
    assert_problem(response, 413)


# -------------------------------------------------------------------- unknown routes


def test_unknown_route_is_a_404_problem(client: TestClient) -> None:
    assert_problem(client.get("/v1/nothing-here"), 404)


def test_wrong_method_is_a_405_problem(client: TestClient) -> None:
    assert_problem(client.get("/v1/plans"), 405)
    assert_problem(client.put("/v1/plans", json=base()), 405)
