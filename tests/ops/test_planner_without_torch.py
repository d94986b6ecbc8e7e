"""The planner needs neither torch nor (until a chart is asked for) matplotlib: the planner-only
image has no torch, and `pip install batchplan` without the `worker` extra neither."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

HEAVY = ("torch", "matplotlib", "numpy")


def _run(code: str, cwd: Path) -> Any:
    """`code` in a fresh interpreter (so that nothing this test process imported counts); what
    it prints last, as JSON."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=dict(os.environ, BATCHPLAN_LOG_LEVEL="warning"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_app_imports_neither_torch_nor_matplotlib(tmp_path: Path) -> None:
    code = f"""
        import json, sys
        import app.main, app.cli
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})))
    """
    assert _run(code, tmp_path) == []


def test_without_torch_the_planner_serves_and_the_worker_says_why(tmp_path: Path) -> None:
    """Default settings (the worker enabled) where torch cannot be imported: plans, exports,
    schedules and elastic plans answer; /readyz and /v1/checks say that torch is missing;
    matplotlib is imported for the first chart and not before."""
    code = f"""
        import json, sys
        sys.modules["torch"] = None  # `import torch` raises ImportError, as where it is not installed
        from fastapi.testclient import TestClient
        from app.main import create_app
        from app.schemas.elastic import ELASTIC_REQUEST_EXAMPLE
        from app.settings import Settings

        plan = {{"topology": {{"num_nodes": 2, "gpus_per_node": 4}}, "global_batch_size": 256}}
        schedule = {{"plan": plan, "train_steps": 100}}
        out = {{}}
        with TestClient(create_app(Settings(jobs_db={str(tmp_path / "jobs.sqlite3")!r}))) as client:
            out["plan"] = client.post("/v1/plans", json=plan).status_code
            out["export"] = client.post("/v1/plans/export/deepspeed", json=plan).status_code
            out["schedule"] = client.post("/v1/plans/schedule", json=schedule).status_code
            out["elastic"] = client.post("/v1/plans/elastic", json=ELASTIC_REQUEST_EXAMPLE).status_code
            ready = client.get("/readyz")
            out["readyz"] = [ready.status_code, ready.json()["worker"].get("error")]
            check = client.post("/v1/checks", json={{"plan": plan}})
            out["check"] = [check.status_code, check.headers["content-type"], check.json()["detail"]]
            out["before_chart"] = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
            chart = client.post("/v1/plans/schedule?format=png", json=schedule)
            out["chart"] = [chart.status_code, chart.headers["content-type"], chart.content[:4].hex()]
            out["after_chart"] = "matplotlib" in sys.modules
        print(json.dumps(out))
    """
    out = _run(code, tmp_path)
    assert [out[k] for k in ("plan", "export", "schedule", "elastic")] == [200] * 4, out
    status, error = out["readyz"]
    assert status == 503 and "torch is not installed" in error
    status, content_type, detail = out["check"]
    assert (status, content_type) == (503, "application/problem+json") and detail == error
    assert out["before_chart"] == ["torch"], "only the blocked entry: nothing imported torch or matplotlib"
    assert out["chart"] == [200, "image/png", "89504e47"]
    assert out["after_chart"] is True
    assert not (tmp_path / "jobs.sqlite3").exists(), "a worker that did not start opened no database"
