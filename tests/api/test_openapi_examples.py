"""Every example the OpenAPI document shows works as documented: each request example, sent as
is (what Swagger's "Try it out" pre-fills), succeeds; each documented error example is what the
operation really answers to the request that provokes it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.apps import fake_client, wait_job
from support.fake_runner import FakeRunner

from app.api.problems import NOT_JSON_EXAMPLE
from app.main import create_app
from app.schemas.elastic import ELASTIC_INFEASIBLE_EXAMPLE
from app.schemas.examples import INFEASIBLE_PLAN, OUT_OF_RANGE_PLAN, plan_example
from app.schemas.exports import SCHEDULE_REQUEST_EXAMPLE
from app.settings import Settings

KEY = "example-key"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    # A default server: every example Swagger pre-fills must run on one as it is.
    yield from fake_client(tmp_path_factory)


@pytest.fixture(scope="module")
def schema(client: TestClient) -> dict[str, Any]:
    return client.get("/openapi.json").json()  # type: ignore[no-any-return]


def _operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            yield path, method, operation


def _examples(entry: dict[str, Any], schema: dict[str, Any]) -> list[Any]:
    """The examples of a media type or parameter, and those of the schema it refers to (what
    Swagger falls back on)."""
    out = [e["value"] for e in entry.get("examples", {}).values()]
    if "example" in entry:
        out.append(entry["example"])
    ref = entry.get("schema", {}).get("$ref")
    if ref:
        out += schema["components"]["schemas"][ref.rsplit("/", 1)[1]].get("examples", [])
    return out


def _request_examples(schema: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(method, url, body) for every request example, path parameters filled from theirs."""
    cases = []
    for path, method, operation in _operations(schema):
        body = operation.get("requestBody", {}).get("content", {}).get("application/json")
        if body is None:
            continue
        bodies = _examples(body, schema)
        assert bodies, f"{method} {path} shows no request example"
        params = [p for p in operation.get("parameters", []) if p["in"] == "path"]
        urls = [path]
        for param in params:
            values = _examples(param, schema)
            assert values, f"{method} {path}: path parameter {param['name']} has no example"
            urls = [u.replace("{" + param["name"] + "}", str(v)) for u in urls for v in values]
        cases += [(method, url, example) for url in urls for example in bodies]
    return cases


def test_every_request_example_succeeds_as_sent(client: TestClient, schema: dict[str, Any]) -> None:
    cases = _request_examples(schema)
    assert {url for _, url, _ in cases} >= {
        "/v1/plans",
        "/v1/plans/schedule",
        "/v1/plans/elastic",
        "/v1/plans/export/torchrun",
        "/v1/checks",
    }
    for method, url, body in cases:
        response = client.request(method, url, json=body)
        assert 200 <= response.status_code < 300, (url, body, response.text)
        if response.status_code == 202:  # a check: it is accepted and runs to the end
            job = wait_job(client, response.headers["location"])
            assert job["status"] == "succeeded" and job["result"]["passed"], job


def test_the_export_format_is_an_enum_and_every_format_exports_the_examples(
    client: TestClient, schema: dict[str, Any]
) -> None:
    (param,) = [
        p for p in schema["paths"]["/v1/plans/export/{format}"]["post"]["parameters"] if p["in"] == "path"
    ]
    formats = param["schema"]["enum"]
    assert "torchrun" in formats and "deepspeed" in formats
    for fmt in formats:
        # torchtitan builds Adam only: the ImageNet recipe (SGD) is refused, the language model's is not.
        body = plan_example("language_model" if fmt == "torchtitan" else "dataset_and_lr")
        response = client.post(f"/v1/plans/export/{fmt}", json=body)
        assert response.status_code == 200, (fmt, response.text)
    assert client.post("/v1/plans/export/ray", json=plan_example("homogeneous")).status_code == 404


def test_the_schema_version_is_the_packages(schema: dict[str, Any]) -> None:
    import importlib.metadata

    assert schema["info"]["version"] == importlib.metadata.version("batchplan") != "1.0.0"


# ----------------------------------------------------------------------------- error examples


def _send(client: TestClient, method: str, url: str, provoke: Any) -> Any:
    """Send what provokes a documented error: a JSON body, or (content, content type)."""
    if isinstance(provoke, tuple):
        content, content_type = provoke
        return client.request(method, url, content=content, headers={"content-type": content_type})
    return client.request(method, url, json=provoke)


BODY_ERRORS: dict[tuple[str, str], Any] = {
    ("400", "not_json"): (NOT_JSON_EXAMPLE, "application/json"),
    ("400", "wrong_content_type"): ("{}", "text/plain"),
    ("413", "too_large"): (b" " * (4 * 1024 * 1024 + 1), "application/json"),
}
PROVOKED: dict[tuple[str, str, str], Any] = {
    ("/v1/plans", "422", "infeasible"): INFEASIBLE_PLAN,
    ("/v1/plans", "422", "out_of_range"): OUT_OF_RANGE_PLAN,
    ("/v1/plans/export/{format}", "422", "infeasible"): INFEASIBLE_PLAN,
    ("/v1/plans/export/{format}", "422", "out_of_range"): OUT_OF_RANGE_PLAN,
    ("/v1/plans/export/{format}", "422", "uneven_for_deepspeed"): ("deepspeed", plan_example("mixed")),
    ("/v1/plans/export/{format}", "422", "uneven_needs_two_changes"): (
        "hf-trainer",
        {**plan_example("mixed"), "global_batch_size": 1001},
    ),
    ("/v1/plans/export/{format}", "404", "unknown_format"): ("ray", plan_example("homogeneous")),
    ("/v1/plans/schedule", "422", "infeasible"): {"plan": INFEASIBLE_PLAN},
    ("/v1/plans/schedule", "422", "out_of_range"): {"plan": OUT_OF_RANGE_PLAN},
    ("/v1/plans/schedule", "422", "rampup_not_in_whole_micro_batches"): {
        **SCHEDULE_REQUEST_EXAMPLE,
        "plan": plan_example("dataset_and_lr"),
    },
    ("/v1/plans/elastic", "422", "no_gpu_count_divides"): ELASTIC_INFEASIBLE_EXAMPLE,
    ("/v1/checks", "422", "infeasible"): {"plan": INFEASIBLE_PLAN},
    ("/v1/checks", "422", "out_of_range"): {"plan": OUT_OF_RANGE_PLAN},
}


def _error_examples(schema: dict[str, Any]) -> Iterator[tuple[str, str, str, str, dict[str, Any]]]:
    for path, method, operation in _operations(schema):
        for status, response in operation["responses"].items():
            if status.startswith(("4", "5")):
                content = response.get("content", {}).get("application/problem+json", {})
                for name, example in content.get("examples", {}).items():
                    yield path, method, status, name, example["value"]


def test_every_error_response_has_its_own_examples(schema: dict[str, Any]) -> None:
    for path, method, operation in _operations(schema):
        for status, response in operation["responses"].items():
            if status.startswith(("4", "5")) and status != "422":  # FastAPI's own 422s have none
                content = response["content"]["application/problem+json"]
                assert content.get("examples"), f"{method} {path} {status} shows ProblemOut's example"
                for example in content["examples"].values():
                    assert example["value"]["status"] == int(status), (path, status, example)


def test_documented_error_examples_are_what_the_operation_answers(
    client: TestClient, schema: dict[str, Any]
) -> None:
    checked = set()
    for path, method, status, name, example in _error_examples(schema):
        if (status, name) in BODY_ERRORS and method == "post":
            provoke = BODY_ERRORS[status, name]
            url = path.replace("{format}", "torchrun")
        elif (path, status, name) in PROVOKED:
            provoke = PROVOKED[path, status, name]
            url = path
            if "{format}" in path:
                fmt, provoke = provoke if isinstance(provoke, tuple) else ("torchrun", provoke)
                url = path.replace("{format}", fmt)
        else:
            continue
        response = _send(client, method, url, provoke)
        assert response.status_code == int(status), (path, name, response.text)
        assert response.json() == example, (path, name)
        checked.add((path, status, name))
    assert {(p, s, n) for p, s, n in PROVOKED} <= checked


def test_documented_worker_errors_are_what_the_worker_answers(
    client: TestClient, schema: dict[str, Any], tmp_path: Path
) -> None:
    examples = {(p, m, s, n): e for p, m, s, n, e in _error_examples(schema)}
    unknown = examples["/v1/checks/{check_id}", "get", "404", "unknown_id"]
    check_id = unknown["detail"].split("'")[1]
    assert client.get(f"/v1/checks/{check_id}").json() == unknown
    accepted = client.post(
        "/v1/checks", json={"plan": plan_example("homogeneous") | {"global_batch_size": 16}}
    )
    finished = wait_job(client, accepted.headers["location"])
    conflict = client.delete(f"/v1/checks/{finished['id']}").json()
    expected = examples["/v1/checks/{check_id}", "delete", "409", "already_finished"]
    assert conflict == {**expected, "detail": expected["detail"].replace(check_id, finished["id"])}
    disabled = Settings(worker_enabled=False, log_level="warning")
    with TestClient(create_app(disabled)) as off:
        assert off.get("/v1/checks").json() == examples["/v1/checks", "get", "503", "disabled"]
    keyed = Settings(jobs_db=tmp_path / "jobs.sqlite3", api_key=KEY, log_level="warning")
    with TestClient(create_app(keyed, runner=FakeRunner())) as locked:
        assert locked.get("/v1/checks").json() == examples["/v1/checks", "get", "401", "no_key"]
