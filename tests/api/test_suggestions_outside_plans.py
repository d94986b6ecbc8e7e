"""Suggestions outside plan requests are tried before they are given too (issue 25): the elastic
body's (its micro-batch sizes included), an export's refusal of a plan it cannot write, and the
export's query parameters. Each suggested value, put where its key says, gets a 200."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_suggestions_name_fields import put

from app.core.exports.registry import EXPORTERS
from app.main import create_app
from app.settings import Settings

RELAXED = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(worker_enabled=False, log_level="warning"))) as test_client:
        yield test_client


def assert_suggestions_work(
    client: TestClient, url: str, body: dict[str, Any], problem: dict[str, Any]
) -> None:
    for key, values in problem.get("suggestions", {}).items():
        for value in values:
            response = client.post(url, json=put(body, key, value))
            assert response.status_code == 200, (key, value, problem["detail"], response.text)
    for change in problem.get("combined_suggestions", []):
        changed = body
        for key, value in change.items():
            changed = put(changed, key, value)
        assert client.post(url, json=changed).status_code == 200, change


elastic_bodies = st.fixed_dictionaries(
    {
        "min_gpus": st.integers(-1, 40),
        "max_gpus": st.integers(1, 60),
        "micro_batch_sizes": st.lists(st.integers(-1, 24), min_size=1, max_size=4),
        "max_global_batch_size": st.integers(1, 200),
    }
)


@RELAXED
@given(body=elastic_bodies)
def test_every_elastic_suggestion_works_where_its_key_says(client: TestClient, body: dict[str, Any]) -> None:
    response = client.post("/v1/plans/elastic", json=body)
    if response.status_code != 200:
        assert response.status_code == 422, response.text
        assert_suggestions_work(client, "/v1/plans/elastic", body, response.json())


def test_a_micro_batch_size_out_of_range_is_named_by_its_index(client: TestClient) -> None:
    body = {"min_gpus": 4, "max_gpus": 7, "micro_batch_sizes": [2, 0], "max_global_batch_size": 8}
    problem = client.post("/v1/plans/elastic", json=body).json()
    assert problem["errors"][0]["pointer"] == "/micro_batch_sizes/1"
    assert problem["suggestions"] == {"micro_batch_sizes.1": [1]}
    assert_suggestions_work(client, "/v1/plans/elastic", body, problem)


def test_a_range_no_batch_suits_is_told_a_range_that_one_does(client: TestClient) -> None:
    body = {"min_gpus": 7, "max_gpus": 7, "micro_batch_sizes": [2], "max_global_batch_size": 8}
    problem = client.post("/v1/plans/elastic", json=body).json()
    assert problem["status"] == 422 and problem["suggestions"]
    assert_suggestions_work(client, "/v1/plans/elastic", body, problem)


plans = st.fixed_dictionaries(
    {
        "topology": st.one_of(
            st.fixed_dictionaries(
                {"num_nodes": st.integers(1, 4), "gpus_per_node": st.sampled_from([2, 4, 8])}
            ),
            st.just(
                {
                    "node_groups": [
                        {"num_nodes": 1, "gpus_per_node": 8, "relative_throughput": 2.0},
                        {"num_nodes": 1, "gpus_per_node": 4},
                    ]
                }
            ),
        ),
        "global_batch_size": st.integers(1, 2000),
    },
    optional={
        "parallelism": st.fixed_dictionaries(
            {}, optional={"tensor": st.sampled_from([1, 2]), "pipeline": st.sampled_from([1, 2])}
        ),
        "divisibility": st.sampled_from(["exact", "balance"]),
    },
)


@RELAXED
@given(fmt=st.sampled_from(list(EXPORTERS)), body=plans)
def test_every_export_refusal_suggests_what_that_format_then_writes(
    client: TestClient, fmt: str, body: dict[str, Any]
) -> None:
    url = f"/v1/plans/export/{fmt}"
    response = client.post(url, json=body)
    if response.status_code != 200:
        assert response.status_code == 422, response.text
        assert_suggestions_work(client, url, body, response.json())


def test_a_refusal_of_two_parallel_sizes_suggests_them_together(client: TestClient) -> None:
    body = {"topology": {"num_nodes": 2, "gpus_per_node": 8}, "global_batch_size": 512}
    url = "/v1/plans/export/accelerate"
    one = client.post(url, json={**body, "parallelism": {"tensor": 2}}).json()
    assert one["suggestions"] == {"parallelism.tensor": [1]}
    two = {**body, "parallelism": {"tensor": 2, "pipeline": 2}}
    problem = client.post(url, json=two).json()
    # Setting either alone to 1 leaves a model-parallel plan that Accelerate still refuses.
    assert "suggestions" not in problem
    assert problem["combined_suggestions"] == [{"parallelism.tensor": 1, "parallelism.pipeline": 1}]
    assert_suggestions_work(client, url, two, problem)


SIXTEEN = {"topology": {"num_nodes": 2, "gpus_per_node": 8}, "global_batch_size": 512}


@pytest.mark.parametrize("fmt", ["slurm", "torchrun", "kubernetes"])
@pytest.mark.parametrize(
    ("option", "value"), [("port", 80), ("port", 70000), ("cpus_per_gpu", 0), ("cpus_per_gpu", 999)]
)
def test_an_export_option_out_of_range_is_suggested_a_value_that_exports(
    client: TestClient, fmt: str, option: str, value: int
) -> None:
    url = f"/v1/plans/export/{fmt}"
    problem = client.post(url, params={option: value}, json=SIXTEEN).json()
    assert problem["errors"][0]["pointer"] == f"/query/{option}"
    [suggested] = problem["suggestions"][option]
    assert client.post(url, params={option: suggested}, json=SIXTEEN).status_code == 200
    # With a body that cannot be exported either, no one value repairs the request.
    broken = {**SIXTEEN, "global_batch_size": 500}
    assert "suggestions" not in client.post(url, params={option: value}, json=broken).json()
