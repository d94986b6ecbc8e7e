"""POST /v1/checks with `throughput` refused at its field, saying what works, and the throughput
chart's documented problems (no such check, not measured, not finished), on a fake runner (no
torch); the measurement itself runs on real ranks in tests/worker/checks/test_throughput_check.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.apps import documented_problems, fake_client, held_running, succeeded
from support.fake_runner import FakeRunner

from app.charts import throughput_chart
from app.contract.codec import encode
from app.contract.kinds.throughput import SPREAD_IS, Throughput, ThroughputPoint

PLAN = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16, "max_micro_batch_size": 8}


# The module's one server runs its checks here; a test holds a check running with its gate.
RUNNER = FakeRunner()


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    yield from fake_client(tmp_path_factory, RUNNER)


def refused(client: TestClient, throughput: Any, plan: dict[str, Any] = PLAN) -> dict[str, Any]:
    answer = client.post("/v1/checks", json={"plan": plan, "throughput": throughput})
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    problem: dict[str, Any] = answer.json()
    return problem


def pointers(problem: dict[str, Any]) -> list[str]:
    return [e["pointer"] for e in problem.get("errors", [])] or [problem.get("pointer", "")]


@pytest.mark.parametrize(
    ("throughput", "pointer", "says"),
    [
        ({"micro_batch_sizes": [1, 4, 2]}, "/throughput/micro_batch_sizes/2", "[1, 2, 4]"),
        ({"micro_batch_sizes": [2, 2]}, "/throughput/micro_batch_sizes/1", "strictly increase"),
        ({"micro_batch_sizes": [4, 16]}, "/throughput/micro_batch_sizes/1", "up to 8"),
        ({"micro_batch_sizes": []}, "/throughput/micro_batch_sizes", ""),
        ({"micro_batch_sizes": [0, 1]}, "/throughput/micro_batch_sizes/0", ""),
        ({"repeats": 0}, "/throughput/repeats", ""),
        ({"warmup_steps": -1}, "/throughput/warmup_steps", ""),
        ({"margin": 1.5}, "/throughput/margin", ""),
        ({"speed": 1}, "/throughput/speed", ""),
    ],
)
def test_bad_throughput_options_are_422_at_their_field(
    client: TestClient, throughput: dict[str, Any], pointer: str, says: str
) -> None:
    problem = refused(client, throughput)
    assert pointer in pointers(problem), problem
    assert says in problem["detail"] + str(problem.get("errors")), problem


def test_a_group_cap_bounds_the_sizes_and_a_mesh_is_refused(client: TestClient) -> None:
    groups = {
        "node_groups": [
            {"name": "a", "num_nodes": 1, "gpus_per_node": 1, "max_micro_batch_size": 4},
            {"name": "b", "num_nodes": 1, "gpus_per_node": 1, "max_micro_batch_size": 6},
        ]
    }
    problem = refused(client, {"micro_batch_sizes": [4, 8]}, {"topology": groups, "global_batch_size": 8})
    assert pointers(problem) == ["/throughput/micro_batch_sizes/1"] and "cap of 6" in problem["detail"]
    mesh = {
        "topology": {"num_nodes": 1, "gpus_per_node": 2},
        "micro_batch_size": 2,
        "parallelism": {"tensor": 2},
    }
    assert pointers(refused(client, {}, mesh)) == ["/throughput"]


def _problems(client: TestClient, status: str) -> dict[str, Any]:
    return documented_problems(client, "/v1/checks/{check_id}/throughput.{format}", status)


def test_the_chart_answers_the_documented_problems(client: TestClient) -> None:
    not_found, conflict = _problems(client, "404"), _problems(client, "409")
    example_id = not_found["unknown_id"]["detail"].split("'")[1]
    assert client.get(f"/v1/checks/{example_id}/throughput.png").json() == not_found["unknown_id"]
    plain = succeeded(client, {"plan": PLAN})["id"]
    answer = client.get(f"/v1/checks/{plain}/throughput.svg")
    assert answer.status_code == 404
    expected = not_found["not_measured"]
    assert answer.json() == {**expected, "detail": expected["detail"].replace(example_id, plain)}
    with held_running(client, RUNNER, {"plan": PLAN, "throughput": {}}) as held:
        answer = client.get(f"/v1/checks/{held}/throughput.png")
        assert answer.status_code == 409
        running = conflict["running"]
        assert answer.json() == {**running, "detail": running["detail"].replace(example_id, held)}


def test_the_chart_draws_a_single_point_and_a_curve() -> None:
    def point(b: int, rate: float) -> ThroughputPoint:
        return ThroughputPoint(b, b / rate, 0.02, rate, None, None, 10, 5, False)

    for points in ((point(4, 100.0),), (point(1, 50.0), point(2, 91.0), point(4, 95.0), point(8, 93.0))):
        t = Throughput(points, 0.05, 5, 1, False, SPREAD_IS, "cpu", 1, "rank 0 alone", None, 0.1, 0.05, ())
        data = encode(t)
        assert data["fastest_micro_batch_size"] == max(points, key=lambda p: p.samples_per_s).micro_batch_size
        assert throughput_chart(data, "svg", "t").startswith(b"<?xml")
    assert data["knee_micro_batch_size"] == 2 and data["fastest_micro_batch_size"] == 4


def test_sizes_past_the_workers_sample_limit_are_refused(tmp_path_factory: pytest.TempPathFactory) -> None:
    small = fake_client(tmp_path_factory, FakeRunner(), max_check_samples=100)
    client = next(small)
    try:
        plan = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}
        problem = refused(client, {"micro_batch_sizes": [64, 128]}, plan)
        assert pointers(problem) == ["/throughput/micro_batch_sizes/1"]
        assert "BATCHPLAN_MAX_CHECK_SAMPLES" in problem["detail"] and "up to 100" in problem["detail"]
    finally:
        small.close()
