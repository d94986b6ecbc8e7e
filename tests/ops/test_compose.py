"""docker-compose.yml, without a Docker engine: against the Compose JSON schema, and the services
it runs (the planner, the GPU worker and its CPU variant) against the Dockerfile's targets and
the settings they read."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from support.image import exec_form
from support.image_targets import dockerfile_env, healthcheck_of, inherited, lineage, named_stages
from support.servers import ROOT

from app.settings import Settings

COMPOSE = ROOT / "docker-compose.yml"
# Vendored with its source and licence (tests/ops/schemas/README.md): a fresh clone runs this.
COMPOSE_SCHEMA = Path(__file__).with_name("schemas") / "compose-spec.json"


def _compose() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml", reason="PyYAML reads docker-compose.yml (pip install pyyaml)")
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return doc


def test_compose_file_matches_the_compose_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="pip install jsonschema")
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


def _default(value: str) -> str:
    """The value of `${VAR:-default}` where VAR is unset."""
    match = re.fullmatch(r"\$\{\w+:-([^}]*)\}", value)
    assert match, value
    return match.group(1)


def test_compose_runs_the_planner_and_a_gpu_worker_with_a_cpu_variant() -> None:
    doc = _compose()
    services = doc["services"]
    for name, service in services.items():
        assert service["init"] is True, name
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


def test_compose_builds_a_planner_image_without_torch_and_distinct_tags() -> None:
    services = _compose()["services"]
    targets = {name: service["build"].get("target") for name, service in services.items()}
    assert targets == {"api": "api", "worker": "worker", "worker-cpu": "worker"}
    assert set(targets.values()) <= set(named_stages())
    assert "args" not in services["api"]["build"], "the planner image takes no torch arguments"
    tags = [service["image"] for service in services.values()]
    assert len(set(tags)) == len(tags), f"two services build the same tag: {tags}"


def test_compose_api_is_read_only_without_a_volume_but_can_draw_charts() -> None:
    api = _compose()["services"]["api"]
    assert api["read_only"] is True
    assert "volumes" not in api
    assert not any(stage.all("VOLUME") for stage in lineage("api")), "nor an anonymous one"
    mplconfig = dockerfile_env("api")["MPLCONFIGDIR"]
    assert any(mplconfig.startswith(f"{tmpfs.rstrip('/')}/") for tmpfs in api["tmpfs"]), mplconfig


def test_compose_healthchecks_are_the_images_and_the_workers_wait_for_warm_ranks() -> None:
    services = _compose()["services"]
    api_check, worker_check = healthcheck_of("api")[1], healthcheck_of("worker")[1]
    assert services["api"]["healthcheck"]["test"] == ["CMD", *api_check]
    assert services["worker-cpu"]["healthcheck"]["test"] == ["CMD", *worker_check]
    # The GPU worker listens on the host's port 8001 (host networking): the same check there.
    on_8001 = [arg.replace("127.0.0.1:8000/", "127.0.0.1:8001/") for arg in worker_check]
    assert services["worker"]["healthcheck"]["test"] == ["CMD", *on_8001]
    for name in ("worker", "worker-cpu"):
        assert services[name]["healthcheck"]["start_period"] == "120s", name


def test_compose_gpu_worker_uses_the_host_network_on_its_own_port() -> None:
    """Multi-node checks: the rendezvous port and the ports NCCL and gloo pick must be reachable
    from the other nodes, which host networking gives (no published ports then)."""
    services = _compose()["services"]
    gpu = services["worker"]
    assert gpu["network_mode"] == "host"
    assert "ports" not in gpu
    argv = gpu["command"]
    assert argv[: argv.index("--host")] == exec_form(inherited("worker", "CMD"))[: argv.index("--host")]
    assert _default(argv[argv.index("--host") + 1]) == "127.0.0.1", "loopback unless BATCHPLAN_PUBLISH"
    port = argv[argv.index("--port") + 1]
    published = [p.rsplit(":", 2)[1] for p in services["api"]["ports"]]
    assert published == ["8000"] and port == "8001", "the worker's port on the host is not the api's"
    assert gpu["environment"]["BATCHPLAN_RENDEZVOUS_HOSTS"] is None, "passed through from the shell"


def test_compose_workers_default_to_one_rank_per_visible_gpu() -> None:
    for name in ("worker", "worker-cpu"):
        value = _compose()["services"][name]["environment"]["BATCHPLAN_PROCESSES_PER_HOST"]
        assert _default(value) == "auto", name
        # The app's own default, which compose states rather than overrides.
        assert Settings.model_fields["processes_per_host"].default == _default(value)
        settings = Settings(processes_per_host=_default(value), worker_enabled=False)
        assert settings.processes_per_host == "auto"
