"""Property-based fuzzing of the HTTP API against its own OpenAPI schema (schemathesis).

In-process over ASGI, worker disabled: no 5xx (except the documented 503 of the worker
endpoints), every response matches its documented schema and status codes, and every
error is application/problem+json. Bounded examples so it fits CI on two cores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import schemathesis

# About 75 s of CPU on one worker (one unit: the module's schema fixture): slow, so that
# pytest-xdist hands it out among the first (support/parallel.py), not last, when the other
# workers have nothing left to run beside it.
pytestmark = pytest.mark.slow

# One test per operation, named at collection from the committed OpenAPI snapshot, which
# tests/api/test_openapi_snapshot.py holds byte-for-byte to the app's document (and the
# fixture below to the operations the app serves). Neither the app nor schemathesis is built
# or imported at collection: every pytest-xdist worker collects every module, and the app's
# document cost each of them 2-3 s of CPU there, schemathesis 1.5 s. schemathesis builds each
# operation's test (its examples, coverage and fuzzing phases) when that test runs; built at
# collection (`schema.parametrize()`), the coverage cases cost every worker 7 s more.
SNAPSHOT = Path(__file__).resolve().parents[1] / "api" / "openapi.snapshot.json"
OPERATIONS = [
    f"{method.upper()} {path}"
    for path, item in json.loads(SNAPSHOT.read_bytes())["paths"].items()
    for method in item
]


@pytest.fixture(scope="module")
def schema() -> Iterator[tuple[schemathesis.BaseSchema, Any, Any]]:
    """The schema as the app serves it (in-process, over ASGI, worker disabled), one client
    for every case and the Hypothesis settings."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, settings
    from schemathesis.python import asgi

    from app.main import create_app
    from app.settings import Settings

    app = create_app(Settings(worker_enabled=False, log_level="warning"))
    served = [f"{method.upper()} {path}" for path, item in app.openapi()["paths"].items() for method in item]
    assert served == OPERATIONS, "the snapshot is stale: see tests/api/test_openapi_snapshot.py"
    loaded = schemathesis.openapi.from_asgi("/openapi.json", app)
    # Valid and invalid requests alike: neither may crash the server or break the schema.
    loaded.config.generation.update(
        modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
    )
    hypothesis_settings = settings(
        max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    # One in-process client for all the cases (schemathesis otherwise makes one per case), and
    # no proxy settings read from the environment for each: neither reaches the app, and the two
    # were a fifth of the module's CPU.
    with asgi.get_client(app) as client:
        client.trust_env = False
        yield loaded, client, hypothesis_settings


WORKER_PATHS = (
    "/v1/checks",
    "/v1/checks/{check_id}",
    "/v1/checks/{check_id}/trajectory.{format}",
    "/v1/checks/{check_id}/throughput.{format}",
    "/v1/checks/{check_id}/lr_scaling.{format}",
    "/v1/check-models",
)
PROBLEM = "application/problem+json"


# The operations whose body holds the plan object (PlanRequestIn) that POST /v1/plans takes
# whole: the export takes it whole too, a check and a schedule under "plan". The coverage
# phase sends every invalid variant of it to each (about 800 requests apiece, a third of the
# module's CPU); the same model refuses them with the same problem, so they go to
# POST /v1/plans alone. Valid variants still go everywhere: there each handler differs.
PLAN_BODY_ELSEWHERE = {
    "POST /v1/plans/export/{format}": "",
    "POST /v1/checks": "plan -> ",
    "POST /v1/plans/schedule": "plan -> ",
}


def _an_invalid_plan_sent_to_plans_already(case: schemathesis.Case) -> bool:
    from schemathesis import GenerationMode
    from schemathesis.core.parameters import ParameterLocation
    from schemathesis.generation.meta import TestPhase

    prefix = PLAN_BODY_ELSEWHERE.get(f"{case.operation.method.upper()} {case.operation.path}")
    meta = case.meta
    if prefix is None or meta is None or meta.phase.name != TestPhase.COVERAGE:
        return False
    data = meta.phase.data
    body = meta.components.get(ParameterLocation.BODY)
    return (
        body is not None
        and body.mode == GenerationMode.NEGATIVE
        and getattr(data, "parameter_location", None) == ParameterLocation.BODY
        and (getattr(data, "description", None) or "").startswith(prefix)
    )


def _conforms(case: schemathesis.Case, client: Any) -> None:
    from schemathesis.checks import (
        content_type_conformance,
        not_a_server_error,
        response_schema_conformance,
        status_code_conformance,
    )

    if _an_invalid_plan_sent_to_plans_already(case):
        return
    worker = case.operation.path in WORKER_PATHS
    response = case.call(session=client)
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
def test_api_conforms_to_its_schema(schema: tuple[schemathesis.BaseSchema, Any, Any], operation: str) -> None:
    from schemathesis.pytest.lazy import get_all_tests

    loaded, client, hypothesis_settings = schema
    method, path = operation.split(" ", 1)

    def conforms(case: schemathesis.Case) -> None:
        _conforms(case, client)

    (built,) = get_all_tests(
        schema=loaded.include(method=method, path=path),
        test_func=conforms,
        settings=hypothesis_settings,
        given_kwargs=None,
    )
    _, run = built.ok()
    run()
