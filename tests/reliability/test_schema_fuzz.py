"""Property-based fuzzing of the HTTP API against its own OpenAPI schema (schemathesis).

In-process over ASGI, worker disabled: no 5xx (except the documented 503 of the worker
endpoints), every response matches its documented schema and status codes, and every
error is application/problem+json. Bounded examples so it fits CI on two cores.
"""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.pytest.lazy import get_all_tests  # noqa: E402

from app.main import create_app  # noqa: E402
from app.settings import Settings  # noqa: E402

APP = create_app(Settings(worker_enabled=False, log_level="warning"))
# One test per operation, named at collection from the app's own document; schemathesis
# builds each operation's test (its examples, coverage and fuzzing phases) when that test
# runs. Built at collection (`schema.parametrize()`), the coverage cases cost every
# pytest-xdist worker 7 s of CPU, since each worker collects every module.
OPERATIONS = [f"{method.upper()} {path}" for path, item in APP.openapi()["paths"].items() for method in item]
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def schema() -> schemathesis.BaseSchema:
    loaded = schemathesis.openapi.from_asgi("/openapi.json", APP)
    # Valid and invalid requests alike: neither may crash the server or break the schema.
    loaded.config.generation.update(
        modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
    )
    return loaded


WORKER_PATHS = (
    "/v1/checks",
    "/v1/checks/{check_id}",
    "/v1/checks/{check_id}/trajectory.{format}",
    "/v1/checks/{check_id}/throughput.{format}",
    "/v1/checks/{check_id}/lr_scaling.{format}",
    "/v1/check-models",
)
PROBLEM = "application/problem+json"


def _conforms(case: schemathesis.Case) -> None:
    worker = case.operation.path in WORKER_PATHS
    response = case.call()
    checks = [status_code_conformance, content_type_conformance, response_schema_conformance]
    if not worker:
        checks.append(not_a_server_error)
    case.validate_response(response, checks=checks)
    if worker:
        assert response.status_code in (503, 400, 404, 405, 422), response.text
    if response.status_code >= 400:
        content_type = response.headers["content-type"]
        content_type = content_type[0] if isinstance(content_type, list) else content_type
        assert content_type.split(";")[0] == PROBLEM, response.text
        body = response.json()
        assert {"type", "title", "status", "detail"} <= body.keys()
        assert body["status"] == response.status_code


@pytest.mark.parametrize("operation", OPERATIONS)
def test_api_conforms_to_its_schema(schema: schemathesis.BaseSchema, operation: str) -> None:
    method, path = operation.split(" ", 1)
    (built,) = get_all_tests(
        schema=schema.include(method=method, path=path),
        test_func=_conforms,
        settings=SETTINGS,
        given_kwargs=None,
    )
    _, run = built.ok()
    run()
