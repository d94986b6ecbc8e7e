"""Stateful fuzzing of a check's lifecycle (schemathesis): it follows the OpenAPI links from
POST /v1/checks to GET /v1/checks/{id} and DELETE /v1/checks/{id} (and back) with the ids
the server returned, against a real uvicorn whose warm ranks run the checks. No response is
a 5xx, and every one matches its documented status, media type and schema. Bounded (and
derandomized) so it fits CI on two cores; the limits keep each generated check small."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.errors import Flaky  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from support.installed import installed  # noqa: E402
from support.servers import Server, serve, worker_env  # noqa: E402

from app.schemas.check_examples import CHECK_EXAMPLES  # noqa: E402

pytestmark = [pytest.mark.slow, installed("torch")]

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# Small checks, quickly refused or quickly run: whatever the fuzzer sends stays within seconds.
LIMITS = {"check_timeout_s": "5", "max_replicas_per_check": "64", "max_check_samples": "4096"}
# Walks until 150 calls were made and the lifecycle was covered (a walk can spend its calls on
# listings and refusals: the budget counts the lifecycle's steps, not calls), at most ten.
RUNS, CALLS = 10, 150
DOCUMENTED = [{**example["value"], "timeout_s": 5} for example in CHECK_EXAMPLES.values()]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("stateful")
    with serve(worker_env(folder / "jobs.sqlite3", 2, **LIMITS), folder / "server.log") as running:
        running.wait_warm(2)
        yield running


def test_the_check_lifecycle_walks_its_links_without_a_server_error(server: Server) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    schema.config.generation.update(modes=[schemathesis.GenerationMode.POSITIVE])
    # Only the lifecycle: its links are what the walk follows.
    lifecycle = schema.include(path_regex=r"^/v1/checks")
    seen: Counter[str] = Counter()
    failures: list[str] = []

    @lifecycle.hook
    def before_generate_body(context: Any, strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        # Half the bodies are the documented examples, which run: generated ones are mostly
        # refused at admission (422), and the walk would rarely reach a check that exists.
        if context.operation is not None and context.operation.method.upper() == "POST":
            return st.one_of(st.sampled_from(DOCUMENTED), strategy)
        return strategy

    class Lifecycle(lifecycle.as_state_machine()):  # type: ignore[misc]
        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            seen[f"{case.operation.method.upper()} {case.operation.path} {response.status_code}"] += 1
            try:
                case.validate_response(response, checks=CHECKS)
            except Exception as err:
                failures.append(f"{case.operation.method.upper()} {case.operation.path}: {err}")
                raise

    # The walk depends on the server's state (a check queued, running or done by now): when
    # Hypothesis replays a scenario and the server answers differently, it stops with Flaky,
    # which is no failure of the server (schemathesis' own runner counts it so too). Each
    # failure of a check is recorded above, whatever Hypothesis makes of it; walk until enough
    # calls were made.
    for _ in range(RUNS):
        with contextlib.suppress(Flaky):
            Lifecycle.run(
                settings=settings(max_examples=40, stateful_step_count=6, deadline=None, database=None)
            )
        if sum(seen.values()) >= CALLS and _walked_the_lifecycle(seen):
            break
    assert failures == [], failures
    print(sorted(seen.items()))
    assert not any(key.endswith(tuple(f" {code}" for code in range(500, 600))) for key in seen), seen
    # The walk went through the lifecycle with real ids: submitted, read back, cancelled or
    # refused as finished.
    assert _walked_the_lifecycle(seen), seen


def _walked_the_lifecycle(seen: Counter[str]) -> bool:
    return (
        seen["POST /v1/checks 202"] >= 3
        and seen["GET /v1/checks/{check_id} 200"] >= 1
        and seen["DELETE /v1/checks/{check_id} 200"] + seen["DELETE /v1/checks/{check_id} 409"] >= 1
    )
