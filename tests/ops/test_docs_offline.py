"""Swagger UI and ReDoc work without internet: the app serves their assets, a browser with only
loopback reachable renders the operations."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from support.servers import ROOT, serve

ARTIFACTS = ROOT / "test-artifacts"
ASSET = re.compile(r"""(?:src|href|spec-url)=["']([^"']+)["']|url:\s*'([^']+)'""")


@pytest.mark.parametrize(
    ("page", "bundle"), [("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")]
)
def test_docs_pages_load_only_assets_the_app_serves(client: TestClient, page: str, bundle: str) -> None:
    response = client.get(page)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assets = [a or b for a, b in ASSET.findall(response.text)]
    assert any(a.endswith(bundle) for a in assets), assets
    assert "/openapi.json" in assets
    for asset in assets:
        assert asset.startswith("/"), f"{page} loads {asset} from elsewhere"
        fetched = client.get(asset)
        assert fetched.status_code == 200 and len(fetched.content) > 100, asset
    js = client.get(next(a for a in assets if a.endswith(bundle)))
    assert "javascript" in js.headers["content-type"] and len(js.content) > 500_000  # the real bundle


def test_docs_pages_stay_out_of_the_schema(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert "/v1/plans" in paths
    assert not {p for p in paths if p.startswith(("/docs", "/redoc", "/static-offline-docs"))}


# ------------------------------------------------------------------ a real browser, offline


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


def _browse(tmp_path: Path, url: str, *extra: str, budget_ms: int = 15000) -> str:
    """The DOM after `budget_ms` of virtual time, in a browser that can reach only 127.0.0.1."""
    argv = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--proxy-server=127.0.0.1:9",  # the discard port: nothing answers there
        "--proxy-bypass-list=127.0.0.1",
        "--window-size=1280,1400",
        f"--virtual-time-budget={budget_ms}",
        *extra,
        "--dump-dom",
        url,
    ]
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=False, start_new_session=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    _chromium()
    tmp = tmp_path_factory.mktemp("docs-server")
    env = {"BATCHPLAN_WORKER_ENABLED": "false", "BATCHPLAN_JOBS_DB": str(tmp / "jobs.sqlite3")}
    with serve(env, tmp / "server.log") as running:
        yield running.url


@pytest.mark.slow
def test_the_browser_cannot_reach_a_cdn(tmp_path: Path) -> None:
    """The control: the flags below really cut the browser off, so a CDN-backed page would fail."""
    page = (
        "data:text/html,<title>t</title>"
        '<script src="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui-bundle.js"></script>'
        "<script>document.title = typeof SwaggerUIBundle</script>"
    )
    assert "<title>undefined</title>" in _browse(tmp_path, page, budget_ms=3000)


@pytest.mark.slow
def test_swagger_ui_renders_the_operations_offline(server: str, tmp_path: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "swagger-ui-offline.png"
    screenshot.unlink(missing_ok=True)
    dom = _browse(tmp_path, f"{server}/docs", f"--screenshot={screenshot}")
    drawn = re.findall(r'class="opblock-summary-path" data-path="([^"]+)"', dom)
    assert {"/v1/plans", "/livez", "/readyz", "/metrics"} <= set(drawn), dom[-2000:]
    assert "opblock-post" in dom, "POST /v1/plans is drawn as an operation"
    # The question the service answers leads (issue 40): POST /v1/plans is drawn first.
    first = re.search(r'class="opblock opblock-(\w+)', dom)
    assert drawn[0] == "/v1/plans" and first is not None and first.group(1) == "post", drawn[:4]
    assert screenshot.is_file() and screenshot.stat().st_size > 10_000


@pytest.mark.slow
def test_redoc_renders_the_operations_offline(server: str, tmp_path: Path) -> None:
    dom = _browse(tmp_path, f"{server}/redoc")
    assert "operation-type post" in dom and "Plan a batch split" in dom, dom[-2000:]
    assert "/v1/plans" in dom
