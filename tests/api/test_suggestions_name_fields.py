"""Every suggestion names a field of the request, by its path (`parallelism.tensor`,
`topology.num_nodes`, `topology.node_groups.0.num_nodes`), and works when substituted there
(issue 25): requests of every shape, most of them wrong somewhere, are sent as a client would
send them; each suggested value is written into the JSON body at its key and sent again."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.bodies import put

from app.main import create_app
from app.settings import Settings


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(worker_enabled=False, log_level="warning"))) as test_client:
        yield test_client


counts = st.integers(1, 12)
odd = st.one_of(counts, st.integers(-2, 0), st.sampled_from([3, 5, 7, 9, 10, 1000, 4097]))
groups = st.lists(
    st.fixed_dictionaries(
        {"num_nodes": st.integers(1, 4), "gpus_per_node": st.sampled_from([1, 2, 3, 4, 6, 8])},
        optional={
            "relative_throughput": st.sampled_from([1.0, 2.0]),
            "max_micro_batch_size": st.integers(1, 64),
        },
    ),
    min_size=1,
    max_size=3,
)
topologies = st.one_of(
    st.fixed_dictionaries(
        {"num_nodes": st.integers(1, 8), "gpus_per_node": st.sampled_from([1, 2, 3, 4, 6, 8])}
    ),
    st.builds(lambda g: {"node_groups": g}, groups),
)
parallel = st.fixed_dictionaries(
    {},
    optional={
        "tensor": st.integers(1, 6),
        "pipeline": st.integers(1, 4),
        "context": st.integers(1, 3),
        "data_parallel_shard": st.integers(1, 8),
        "expert": st.integers(1, 4),
    },
)
bodies = st.fixed_dictionaries(
    {"topology": topologies, "global_batch_size": st.one_of(odd, st.integers(1, 5000))},
    optional={
        "micro_batch_size": odd,
        "gradient_accumulation_steps": odd,
        "max_micro_batch_size": st.integers(1, 64),
        "divisibility": st.sampled_from(["exact", "round_down", "round_up", "balance"]),
        "parallelism": parallel,
        "dataset": st.fixed_dictionaries({"num_samples": st.integers(0, 10_000)}),
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_every_suggestion_names_a_request_field_and_plans_when_substituted(
    client: TestClient, body: dict[str, Any]
) -> None:
    response = client.post("/v1/plans", json=body)
    if response.status_code == 200:
        return
    assert response.status_code == 422, response.text
    problem = response.json()
    for key, values in problem.get("suggestions", {}).items():
        assert values, key
        for value in values:
            fixed = client.post("/v1/plans", json=put(body, key, value))
            assert fixed.status_code == 200, (key, value, problem["detail"], fixed.text)
    for change in problem.get("combined_suggestions", []):
        fixed_body = body
        for key, value in change.items():
            fixed_body = put(fixed_body, key, value)
        assert client.post("/v1/plans", json=fixed_body).status_code == 200, change


# The issue's two requests: a tensor size that does not divide 16 GPUs, a global batch that 16
# replicas cannot share. Neither is told about world_size or data_parallel_size, which no
# request has; both are told about GPU counts under topology (and the first about tensor sizes).
SIXTEEN = {"num_nodes": 2, "gpus_per_node": 8}


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        (
            {"topology": SIXTEEN, "parallelism": {"tensor": 3}, "global_batch_size": 64},
            {"parallelism.tensor", "topology.num_nodes", "topology.gpus_per_node"},
        ),
        ({"topology": SIXTEEN, "global_batch_size": 10}, {"global_batch_size", "topology.gpus_per_node"}),
    ],
)
@pytest.mark.parametrize("where", ["/v1/plans", "/v1/plans/schedule", "/v1/plans/export/torchrun"])
def test_the_issues_requests_are_told_about_fields_they_have(
    client: TestClient, body: dict[str, Any], fields: set[str], where: str
) -> None:
    sent = {"plan": body} if where.endswith("schedule") else body
    problem = client.post(where, json=sent).json()
    assert set(problem["suggestions"]) == fields
    for key, values in problem["suggestions"].items():
        for value in values:
            assert client.post("/v1/plans", json=put(body, key, value)).status_code == 200, (key, value)
