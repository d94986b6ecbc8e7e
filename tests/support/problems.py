"""What a 4xx answer must be, checked one way for every test: an RFC 9457 problem, and a field
error naming the field's JSON pointer; a raw POST of any bytes; and the valid plan body the
error tests break one field of (not a test module)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from .bodies import put

PROBLEM = "application/problem+json"
TOPOLOGY = {"num_nodes": 2, "gpus_per_node": 8}


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


def assert_wrong_plan(client: TestClient, body: dict[str, Any], pointer: str, works: str) -> dict[str, Any]:
    """POST /v1/plans of `body` is a 422 at `pointer` whose detail says `works` (what would), and
    each of its suggestions plans when substituted alone."""
    problem = assert_field_error(client.post("/v1/plans", json=body), pointer)
    assert works in problem["errors"][0]["detail"], problem
    for key, values in problem.get("suggestions", {}).items():
        for value in values:
            assert client.post("/v1/plans", json=put(body, key, value)).status_code == 200, (key, value)
    return problem


def post_raw(client: TestClient, content: bytes | str, content_type: str | None = "application/json") -> Any:
    headers = {"content-type": content_type} if content_type else {}
    return client.post("/v1/plans", content=content, headers=headers)
