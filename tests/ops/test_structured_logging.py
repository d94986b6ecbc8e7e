"""Structured logging: JSON lines with request and job ids, one access line per request, no secrets."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from app.logging_setup import REDACTED, configure_logging, job_id_var
from app.main import create_app
from app.settings import Settings

KEY = "bp-test-key-7f3a9c1e5d"
PLAN = {"topology": {"num_nodes": 2, "gpus_per_node": 8}, "global_batch_size": 512}


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    configure_logging(Settings(worker_enabled=False))


def _app(**overrides: Any) -> FastAPI:
    app = create_app(Settings(worker_enabled=False, **overrides))
    log = logging.getLogger("batchplan.test")

    @app.get("/test-log")
    def test_log(request: Request) -> dict[str, str]:  # sync: runs in the thread pool
        log.info("inside the request, headers %s", dict(request.headers), extra={"note": KEY})
        try:
            raise RuntimeError(f"failed with key {KEY}")
        except RuntimeError:
            log.exception("handled")
        return {"ok": "yes"}

    return app


def _records(err: str) -> list[dict[str, Any]]:
    lines = [line for line in err.splitlines() if line.strip()]
    return [json.loads(line) for line in lines]  # every line is one JSON object


def test_json_lines_carry_the_given_request_id(capsys: pytest.CaptureFixture[str]) -> None:
    with TestClient(_app(log_format="json")) as client:
        capsys.readouterr()
        assert client.post("/v1/plans", json=PLAN, headers={"X-Request-ID": "req-plan-42"}).status_code == 200
        assert client.get("/test-log", headers={"X-Request-ID": "req-log-43"}).status_code == 200
        unnamed = client.get("/livez")
    records = _records(capsys.readouterr().err)
    for record in records:
        assert {"time", "level", "logger", "message", "request_id"} <= record.keys()
        assert "job_id" not in record

    access = {r["request_id"]: r for r in records if r["logger"] == "batchplan.access"}
    plan = access["req-plan-42"]
    assert (plan["method"], plan["route"], plan["status"], plan["level"]) == (
        "POST",
        "/v1/plans",
        200,
        "info",
    )
    assert isinstance(plan["duration_ms"], float) and plan["duration_ms"] >= 0
    assert plan["message"].startswith("POST /v1/plans 200 ")
    # A generated id is logged as well, and it is the one the response carries.
    assert access[unnamed.headers["x-request-id"]]["route"] == "/livez"
    # A line logged inside a (sync) handler gets the request's id through the context variable.
    inside = next(r for r in records if r["logger"] == "batchplan.test" and r["level"] == "info")
    assert inside["request_id"] == "req-log-43"
    handled = next(r for r in records if r["message"] == "handled")
    assert handled["level"] == "error" and "RuntimeError" in handled["exc_info"]


def test_job_id_is_logged_while_its_context_variable_is_set(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(Settings(worker_enabled=False, log_format="json"))
    capsys.readouterr()
    log = logging.getLogger("batchplan.worker.test")
    token = job_id_var.set("job-123")
    try:
        log.warning("running")
    finally:
        job_id_var.reset(token)
    log.warning("idle")
    running, idle = _records(capsys.readouterr().err)
    assert running["job_id"] == "job-123" and running["message"] == "running"
    assert "job_id" not in idle and idle["request_id"] is None


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_the_api_key_never_reaches_the_log(log_format: str, capsys: pytest.CaptureFixture[str]) -> None:
    with TestClient(_app(log_format=log_format, api_key=KEY)) as client:
        client.get("/test-log", headers={"Authorization": f"Bearer {KEY}", "X-Request-ID": "r1"})
        client.get("/test-log", headers={"X-API-Key": KEY})
        # Header values that are not the configured key are secrets too.
        client.get(
            "/test-log", headers={"Authorization": "Basic dXNlcjpwYXNzd29yZA==", "X-API-Key": "other-k"}
        )
    err = capsys.readouterr().err
    assert "inside the request" in err and "handled" in err, "the handler logged"
    assert KEY not in err
    assert "dXNlcjpwYXNzd29yZA==" not in err and "other-k" not in err
    assert "Bearer " + REDACTED in err and "Basic " + REDACTED in err
    assert f"failed with key {REDACTED}" in err, "tracebacks are redacted too"
    if log_format == "json":
        notes = [r["note"] for r in _records(err) if "note" in r]
        assert notes and set(notes) == {REDACTED}, "extra fields are redacted too"


def test_console_format_and_level_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BATCHPLAN_LOG_FORMAT", "console")
    monkeypatch.setenv("BATCHPLAN_LOG_LEVEL", "info")
    with TestClient(create_app(Settings(worker_enabled=False))) as client:
        client.get("/livez", headers={"X-Request-ID": "console-1"})
    line = next(x for x in capsys.readouterr().err.splitlines() if "batchplan.access" in x)
    assert " INFO " in line and "[request_id=console-1] GET /livez 200 " in line

    monkeypatch.setenv("BATCHPLAN_LOG_LEVEL", "warning")
    with TestClient(create_app(Settings(worker_enabled=False))) as client:
        client.get("/livez")
    assert "batchplan.access" not in capsys.readouterr().err, "no access lines below their level"


def test_configure_logging_is_idempotent() -> None:
    root = logging.getLogger()
    before = [h for h in root.handlers if type(h).__name__ == "_StderrHandler"]
    configure_logging(Settings(worker_enabled=False))
    configure_logging(Settings(worker_enabled=False, log_format="json"))
    ours = [h for h in root.handlers if type(h).__name__ == "_StderrHandler"]
    assert len(ours) == 1 and len(before) <= 1
    assert logging.getLogger("uvicorn.access").disabled, "the access line comes from batchplan.access"
