"""BATCHPLAN_API_KEY: every worker route requires it, the planner only with BATCHPLAN_PROTECT_PLANNER,
the operational endpoints never, and the key never reaches the log."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.logging_setup import configure_logging
from app.main import create_app
from app.settings import Settings

KEY = "bp-auth-key-c0ffee-93a1d7"
PLAN = {"topology": {"num_nodes": 2, "gpus_per_node": 8}, "global_batch_size": 512}
OPEN_OPS = ("/livez", "/readyz", "/metrics", "/docs", "/openapi.json")


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    configure_logging(Settings(worker_enabled=False))


def _app(**overrides: Any) -> FastAPI:
    return create_app(Settings(worker_enabled=False, log_level="warning", **overrides))


def _routes(app: FastAPI, prefix: str) -> list[tuple[str, str]]:
    """(method, concrete path) for every operation under `prefix` in the app's OpenAPI schema
    (every route the routers declare), path parameters filled in."""
    found = []
    for template, operations in app.openapi()["paths"].items():
        if template.startswith(prefix):
            path = re.sub(r"\{[^}]+\}", "some-id", template.replace("{format}", "png"))
            found += [(method.upper(), path) for method in sorted(operations)]
    return found


def _call(client: TestClient, method: str, path: str, headers: dict[str, str] | None = None) -> Any:
    body = {"plan": PLAN} if path.startswith("/v1/checks") else PLAN
    return client.request(method, path, json=body if method == "POST" else None, headers=headers or {})


def _assert_401(response: Any) -> None:
    assert response.status_code == 401, (response.request.url, response.text)
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["www-authenticate"].startswith("Bearer")
    problem = response.json()
    assert problem["status"] == 401 and "Authorization: Bearer" in problem["detail"]
    assert KEY not in response.text


def test_every_worker_route_requires_the_key() -> None:
    app = _app(api_key=KEY)
    worker = _routes(app, "/v1/checks") + _routes(app, "/v1/host")
    # POST, GET list, GET one, DELETE one, GET a run's chart, GET /v1/host: all of them, not only some
    assert {m for m, _ in worker} == {"GET", "POST", "DELETE"} and len(worker) == 8, worker
    with TestClient(app) as client:
        for method, path in worker:
            _assert_401(_call(client, method, path))
            _assert_401(_call(client, method, path, {"Authorization": "Bearer not-the-key"}))
            _assert_401(_call(client, method, path, {"X-API-Key": KEY[:-1]}))
            _assert_401(_call(client, method, path, {"Authorization": f"Basic {KEY}"}))
            _assert_401(_call(client, method, path, {"Authorization": KEY}))  # no scheme
            for good in (
                {"Authorization": f"Bearer {KEY}"},
                {"authorization": f"bearer {KEY}"},
                {"X-API-Key": KEY},
            ):
                response = _call(client, method, path, good)
                # past the key: the worker is disabled in this app, so 503 (or /v1/host's 200)
                assert response.status_code in (200, 503), (method, path, good, response.text)


def test_the_key_is_checked_before_the_body() -> None:
    with TestClient(_app(api_key=KEY)) as client:
        # A content type that is not JSON is refused from the headers alone, before routing
        # (app/api/middleware.py); it reveals nothing, and the body is never read.
        wrong = client.post("/v1/checks", content=b"not json", headers={"content-type": "text/plain"})
        assert wrong.status_code == 400 and wrong.headers["content-type"] == "application/problem+json"
        _assert_401(client.post("/v1/checks", json={"plan": "nonsense"}))


def test_without_a_key_everything_is_open() -> None:
    app = _app()
    with TestClient(app) as client:
        assert client.get("/v1/host").status_code == 200
        assert client.get("/v1/checks").status_code == 503  # worker disabled, not 401
        for method, path in _routes(app, "/v1/plans"):
            assert _call(client, method, path).status_code != 401


def test_the_planner_and_operations_stay_open_unless_protect_planner() -> None:
    app = _app(api_key=KEY)
    planner = _routes(app, "/v1/plans")
    assert ("POST", "/v1/plans") in planner and len(planner) >= 4, planner
    with TestClient(app) as client:
        for method, path in planner:
            assert _call(client, method, path).status_code != 401, path
        assert client.post("/v1/plans", json=PLAN).status_code == 200
        for path in OPEN_OPS:
            assert client.get(path).status_code == 200, path

    protected = _app(api_key=KEY, protect_planner=True)
    with TestClient(protected) as client:
        for method, path in _routes(protected, "/v1/plans"):
            _assert_401(_call(client, method, path))
            _assert_401(_call(client, method, path, {"X-API-Key": "wrong"}))
            assert _call(client, method, path, {"X-API-Key": KEY}).status_code != 401, path
        assert (
            client.post("/v1/plans", json=PLAN, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        )
        for path in OPEN_OPS:
            assert client.get(path).status_code == 200, path


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHPLAN_API_KEY", KEY)
    monkeypatch.setenv("BATCHPLAN_PROTECT_PLANNER", "true")
    monkeypatch.setenv("BATCHPLAN_WORKER_ENABLED", "false")
    settings = Settings()
    assert settings.api_key is not None and settings.api_key.get_secret_value() == KEY
    assert KEY not in repr(settings) and KEY not in str(settings.model_dump())
    with TestClient(create_app(settings)) as client:
        _assert_401(client.post("/v1/plans", json=PLAN))
        _assert_401(client.get("/v1/host"))
        assert client.get("/v1/host", headers={"X-API-Key": KEY}).status_code == 200


def test_the_key_never_reaches_the_log(capsys: pytest.CaptureFixture[str]) -> None:
    app = _app(api_key=KEY, protect_planner=True, log_format="json")
    configure_logging(Settings(worker_enabled=False, api_key=KEY, log_format="json", log_level="debug"))
    with TestClient(app) as client:
        capsys.readouterr()
        for headers in (
            {},
            {"Authorization": f"Bearer {KEY}"},
            {"X-API-Key": KEY},
            {"Authorization": f"Bearer {KEY}x"},  # a wrong key that contains the right one
            {"X-API-Key": f"{KEY}{KEY}"},
        ):
            client.post("/v1/plans", json=PLAN, headers=headers)
            client.get("/v1/checks", headers=headers)
            client.get(f"/v1/checks/{KEY}", headers=headers)  # in the path, too
            client.get("/v1/host", headers=headers)
    out = capsys.readouterr()
    assert '"logger": "batchplan.access"' in out.err, "the requests were logged"
    assert " 401 " in out.err and " 200 " in out.err
    assert KEY not in out.err and KEY not in out.out


@pytest.mark.slow
def test_api_key_guards_the_worker_endpoints() -> None:
    settings = Settings(api_key="s3cret", worker_enabled=False, log_level="warning")
    with TestClient(create_app(settings)) as guarded:
        for method, path in [
            ("get", "/v1/host"),
            ("get", "/v1/checks"),
            ("post", "/v1/checks"),
            ("get", "/v1/checks/x"),
            ("delete", "/v1/checks/x"),
        ]:
            response = getattr(guarded, method)(path)
            assert response.status_code == 401, path
            assert response.headers["content-type"] == "application/problem+json"
            assert response.headers["www-authenticate"].startswith("Bearer")
        assert guarded.get("/v1/host", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert guarded.get("/v1/host", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert guarded.get("/v1/host", headers={"X-API-Key": "s3cret"}).json()["worker_enabled"] is False
        # without the worker the endpoints say so, as problems
        disabled = guarded.get("/v1/checks", headers={"X-API-Key": "s3cret"})
        assert disabled.status_code == 503 and disabled.headers["content-type"] == "application/problem+json"
        assert (
            guarded.post(
                "/v1/plans", json={"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}
            ).status_code
            == 200
        )
