"""A catalogue of hostile or broken requests across every endpoint.

Each gets the right 4xx as problem+json naming the field (errors[].pointer or the detail),
and afterwards the server is healthy: /livez answers and a valid plan is still planned.
tests/api/test_problems_api.py and test_malformed_requests.py cover /v1/plans's own error
paths; this covers the other endpoints and cross-endpoint cases. The check endpoints run on a
service that stores jobs but never runs them (see conftest.queued_only_client), so nothing
here starts a rank.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

E2 = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}
MIXED = {
    "topology": {
        "node_groups": [
            {"name": "fast", "num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 2.0},
            {"name": "slow", "num_nodes": 1, "gpus_per_node": 2},
        ]
    },
    "global_batch_size": 60,
}
ELASTIC = {"min_gpus": 1, "max_gpus": 4, "micro_batch_sizes": [2], "max_global_batch_size": 64}
PROBLEM = "application/problem+json"


class Case(NamedTuple):
    method: str
    path: str
    kwargs: dict[str, Any]
    status: int
    where: str  # a pointer in errors[], or (for problems without errors) a substring of detail


def post(path: str, body: Any, status: int, where: str, **extra: Any) -> Case:
    return Case("post", path, {"json": body, **extra}, status, where)


def raw(path: str, content: bytes, content_type: str | None, status: int, where: str) -> Case:
    headers = {"content-type": content_type} if content_type else {}
    return Case("post", path, {"content": content, "headers": headers}, status, where)


EXPORT = "/v1/plans/export/torchrun"
SCHEDULE = "/v1/plans/schedule"
ELASTIC_PATH = "/v1/plans/elastic"
CHECKS = "/v1/checks"
DEEP = b'{"topology": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"

CATALOGUE: dict[str, Case] = {
    # ---------------------------------------------------------------- export
    "export-world-does-not-divide": post(
        EXPORT,
        {"topology": {"num_nodes": 1, "gpus_per_node": 3}, "global_batch_size": 16},
        422,
        "/global_batch_size",
    ),
    "export-uneven-split-to-deepspeed": post("/v1/plans/export/deepspeed", MIXED, 422, "/"),
    "export-unknown-format": post("/v1/plans/export/ray", E2, 404, "known formats"),
    "export-format-path-traversal": post("/v1/plans/export/..%2F..%2Fetc%2Fpasswd", E2, 404, "Not Found"),
    "export-format-huge": post("/v1/plans/export/" + "x" * 4000, E2, 404, "known formats"),
    "export-port-privileged": post(EXPORT + "?port=80", E2, 422, "/query/port"),
    "export-port-not-a-number": post(EXPORT + "?port=abc", E2, 422, "/query/port"),
    "export-script-shell-injection": post(EXPORT + "?script=a;rm%20-rf%20/", E2, 422, "/query/script"),
    "export-image-command-substitution": post(EXPORT + "?image=$(id)", E2, 422, "/query/image"),
    "export-job-name-uppercase": post("/v1/plans/export/slurm?job_name=UPPER", E2, 422, "/query/job_name"),
    "export-text-body": raw(EXPORT, b"global_batch_size=16", "text/plain", 400, "application/json"),
    "export-unknown-field": post(EXPORT, {**E2, "world": 2}, 422, "/world"),
    "export-bad-json": raw(EXPORT, b'{"topology":', "application/json", 400, ""),
    # -------------------------------------------------------------- schedule
    "schedule-max-points-one": post(SCHEDULE, {"plan": E2, "max_points": 1}, 422, "/max_points"),
    "schedule-max-points-huge": post(SCHEDULE, {"plan": E2, "max_points": 10**9}, 422, "/max_points"),
    "schedule-train-steps-over-2^53": post(SCHEDULE, {"plan": E2, "train_steps": 2**53}, 422, "/train_steps"),
    "schedule-train-steps-zero": post(SCHEDULE, {"plan": E2, "train_steps": 0}, 422, "/train_steps"),
    "schedule-negative-min-lr": post(SCHEDULE, {"plan": E2, "train_steps": 10, "min_lr": -1}, 422, "/min_lr"),
    "schedule-nested-plan-infeasible": post(
        SCHEDULE, {"plan": {**E2, "global_batch_size": 1}, "train_steps": 10}, 422, "/plan/global_batch_size"
    ),
    "schedule-rampup-zero": post(
        SCHEDULE,
        {
            "plan": E2,
            "train_steps": 10,
            "rampup": {"start_batch_size": 0, "batch_size_increment": 1, "rampup_samples": 1},
        },
        422,
        "/rampup/start_batch_size",
    ),
    "schedule-no-run-length": post(SCHEDULE, {"plan": E2}, 422, "/train_steps"),
    "schedule-unknown-chart-format": post(SCHEDULE + "?format=gif", {"plan": E2}, 422, "/query/format"),
    "schedule-unknown-field": post(SCHEDULE, {"plan": E2, "train_steps": 10, "extra": 1}, 422, "/extra"),
    "schedule-plan-unknown-field": post(
        SCHEDULE, {"plan": {**E2, "gpus": 2}, "train_steps": 10}, 422, "/plan/gpus"
    ),
    "schedule-plan-missing": post(SCHEDULE, {"train_steps": 10}, 422, "/plan"),
    "schedule-deep-json": raw(SCHEDULE, DEEP, "application/json", 400, ""),
    # --------------------------------------------------------------- elastic
    "elastic-min-above-max": post(ELASTIC_PATH, {**ELASTIC, "min_gpus": 8}, 422, "/max_gpus"),
    "elastic-no-micro-batches": post(
        ELASTIC_PATH, {**ELASTIC, "micro_batch_sizes": []}, 422, "/micro_batch_sizes"
    ),
    "elastic-zero-micro-batch": post(
        ELASTIC_PATH, {**ELASTIC, "micro_batch_sizes": [0]}, 422, "/micro_batch_sizes/0"
    ),
    "elastic-too-many-micro-batches": post(
        ELASTIC_PATH, {**ELASTIC, "micro_batch_sizes": list(range(1, 200))}, 422, "/micro_batch_sizes"
    ),
    "elastic-cap-below-micro-batch": post(
        ELASTIC_PATH, {**ELASTIC, "max_global_batch_size": 1}, 422, "/micro_batch_sizes"
    ),
    "elastic-string-count": post(ELASTIC_PATH, {**ELASTIC, "min_gpus": "1"}, 422, "/min_gpus"),
    "elastic-float-count": post(ELASTIC_PATH, {**ELASTIC, "max_gpus": 4.5}, 422, "/max_gpus"),
    "elastic-bool-count": post(ELASTIC_PATH, {**ELASTIC, "max_gpus": True}, 422, "/max_gpus"),
    "elastic-string-flag": post(ELASTIC_PATH, {**ELASTIC, "prefer_larger": "yes"}, 422, "/prefer_larger"),
    "elastic-gpus-over-ten-million": post(
        ELASTIC_PATH, {**ELASTIC, "max_gpus": 10_000_001}, 422, "/max_gpus"
    ),
    "elastic-array-body": post(ELASTIC_PATH, [1, 2], 422, ""),
    "elastic-null-body": raw(ELASTIC_PATH, b"null", "application/json", 422, ""),
    "elastic-form-body": raw(
        ELASTIC_PATH, b"min_gpus=1", "application/x-www-form-urlencoded", 400, "application/json"
    ),
    "elastic-nan-lr": raw(
        ELASTIC_PATH,
        b'{"min_gpus":1,"max_gpus":4,"micro_batch_sizes":[2],"max_global_batch_size":64,'
        b'"learning_rate":{"base_lr":NaN}}',
        "application/json",
        422,
        "/learning_rate/base_lr",
    ),
    # ---------------------------------------------------------------- checks
    "check-global-below-replicas": post(
        CHECKS,
        {"plan": {"topology": {"num_nodes": 1, "gpus_per_node": 4}, "global_batch_size": 2}},
        422,
        "/plan/global_batch_size",
    ),
    "check-too-many-replicas": post(
        CHECKS,
        {"plan": {"topology": {"num_nodes": 32768, "gpus_per_node": 8}, "global_batch_size": 262144}},
        422,
        "/plan/topology",
    ),
    "check-caps-cannot-be-met": post(
        CHECKS,
        {"plan": {**E2, "micro_batch_size": 8, "max_micro_batch_size": 4, "gradient_accumulation_steps": 1}},
        422,
        "/plan/",
    ),
    "check-seed-over-int32": post(CHECKS, {"plan": E2, "seed": 2**31}, 422, "/seed"),
    "check-negative-seed": post(CHECKS, {"plan": E2, "seed": -1}, 422, "/seed"),
    "check-bool-seed": post(CHECKS, {"plan": E2, "seed": True}, 422, "/seed"),
    "check-timeout-zero": post(CHECKS, {"plan": E2, "timeout_s": 0}, 422, "/timeout_s"),
    "check-timeout-string-nan": post(CHECKS, {"plan": E2, "timeout_s": "nan"}, 422, "/timeout_s"),
    "check-unknown-model-field": post(CHECKS, {"plan": E2, "model": "os.system"}, 422, "/model"),
    "check-import-path-field": post(CHECKS, {"plan": E2, "module": "subprocess:run"}, 422, "/module"),
    "check-rendezvous-injection": post(
        CHECKS,
        {"plan": E2, "rendezvous": {"endpoint": "evil:29400;rm -rf /", "nnodes": 1, "run_id": "x"}},
        422,
        "/rendezvous/endpoint",
    ),
    "check-rendezvous-run-id-traversal": post(
        CHECKS,
        {"plan": E2, "rendezvous": {"endpoint": "h:1", "nnodes": 1, "run_id": "../../x"}},
        422,
        "/rendezvous/run_id",
    ),
    "check-rendezvous-zero-nodes": post(
        CHECKS,
        {"plan": E2, "rendezvous": {"endpoint": "h:1", "nnodes": 0, "run_id": "x"}},
        422,
        "/rendezvous/nnodes",
    ),
    "check-empty-body": post(CHECKS, {}, 422, "/plan"),
    "check-plan-is-a-string": post(CHECKS, {"plan": "E2"}, 422, "/plan"),
    "check-text-body": raw(CHECKS, b"plan", "text/plain", 400, "application/json"),
    "check-deep-json": raw(CHECKS, DEEP, "application/json", 400, ""),
    "check-no-content-type": raw(CHECKS, b'{"plan": {}}', None, 400, "Content-Type"),
    # ------------------------------------------------------------- check ids
    "check-id-not-found": Case("get", "/v1/checks/0123456789abcdef0123456789abcdef", {}, 404, "no check"),
    "check-id-sql-injection": Case("get", "/v1/checks/' OR '1'='1", {}, 404, "no check"),
    "check-id-traversal-encoded": Case("get", "/v1/checks/..%2F..%2Fetc%2Fpasswd", {}, 404, "Not Found"),
    "check-id-traversal-dotdot": Case("delete", "/v1/checks/%2e%2e", {}, 404, "no check"),
    "check-id-nul": Case("get", "/v1/checks/%00", {}, 404, "no check"),
    "check-id-huge": Case("get", "/v1/checks/" + "a" * 6000, {}, 404, "no check"),
    "check-cancel-unknown": Case("delete", "/v1/checks/nope", {}, 404, "no check"),
    "check-list-limit-zero": Case("get", "/v1/checks?limit=0", {}, 422, "/query/limit"),
    "check-list-limit-huge": Case("get", "/v1/checks?limit=100000", {}, 422, "/query/limit"),
    "check-list-bad-status": Case("get", "/v1/checks?status=bogus", {}, 422, "/query/status"),
    "check-wrong-method": Case("put", "/v1/checks/abc", {}, 405, ""),
    # ----------------------------------------------------------- cross-endpoint
    "oversized-body-export": raw(EXPORT, b" " * (4 * 1024 * 1024 + 1), "application/json", 413, "limit"),
    "oversized-body-checks": raw(CHECKS, b" " * (4 * 1024 * 1024 + 1), "application/json", 413, "limit"),
    "plans-wrong-method": Case("get", "/v1/plans", {}, 405, ""),
    "unknown-version-prefix": post("/v2/plans", E2, 404, ""),
}


def _pointers(problem: dict[str, Any]) -> list[str]:
    return [e["pointer"] for e in problem.get("errors", [])]


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_hostile_request_gets_a_named_4xx_and_the_server_stays_healthy(
    queued_only_client: Any, name: str
) -> None:
    client = queued_only_client
    case = CATALOGUE[name]
    response = getattr(client, case.method)(case.path, **case.kwargs)
    assert response.status_code == case.status, (name, response.text[:500])
    assert response.headers["content-type"] == PROBLEM, name
    problem = response.json()
    assert problem["status"] == case.status and problem["type"].startswith("urn:batchplan:problem:")
    assert problem["title"] and isinstance(problem["detail"], str)
    if problem.get("errors"):
        # the field at fault is named; "/" or "/plan/" only require some field under it
        assert any(p.startswith(case.where) for p in _pointers(problem)), (name, problem)
    else:
        assert case.where in problem["detail"], (name, problem)
    assert client.get("/livez").json() == {"status": "ok"}
    assert client.post("/v1/plans", json=E2).json()["micro_batch_size"] == 8
    # nothing hostile was queued
    assert client.get("/v1/checks").json()["checks"] == []


def test_catalogue_is_large_and_covers_every_endpoint() -> None:
    assert len(CATALOGUE) >= 40
    paths = {c.path.split("?")[0] for c in CATALOGUE.values()}
    for prefix in (EXPORT, SCHEDULE, ELASTIC_PATH, CHECKS, "/v1/checks/", "/v1/plans"):
        assert any(p.startswith(prefix) for p in paths), prefix


def test_a_storm_of_hostile_requests_leaves_the_planner_correct(queued_only_client: Any) -> None:
    client = queued_only_client
    before = client.post("/v1/plans", json=MIXED).json()
    for _ in range(3):
        for case in CATALOGUE.values():
            assert getattr(client, case.method)(case.path, **case.kwargs).status_code < 500
    assert client.post("/v1/plans", json=MIXED).json() == before
    assert client.get("/livez").status_code == 200
    # Its runner never started: /readyz says so rather than ready, and the planner still serves.
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["status"] == "warming" and ready.json()["planner"]
