"""A check model whose factory's module is not there is refused before any rank starts: in
the web process (without importing torch or the operator's code), by the rank program that
torchrun starts, and by the CLI (tests/cli/test_check_models_cli.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from support.fake_runner import FakeRunner

from app.contract.targets import missing_module
from app.main import create_app
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
PLAN = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}


def _package(root: Path, name: str, init: str, modules: dict[str, str]) -> None:
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(init)
    for module, source in modules.items():
        (root / name / f"{module}.py").write_text(source)


def test_a_module_is_found_as_import_finds_it_without_running_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A package whose __init__ must not run here: it might import torch, or do anything.
    _package(tmp_path, "heavy_pkg", "raise RuntimeError('the package ran')\n", {"models": "def f(): pass\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert missing_module("heavy_pkg.models:f") is None
    assert "heavy_pkg" not in sys.modules
    assert missing_module("heavy_pkg.nothing:f") == "no module named 'heavy_pkg.nothing'"
    assert missing_module("no_such_pkg_here.models:f") == "no module named 'no_such_pkg_here'"
    assert (
        missing_module("json.decoder.deeper:f")
        == "'json.decoder' is a module, not a package: it has no 'deeper'"
    )
    assert missing_module("os.path:join") is None  # os.path is in sys.modules, though os is no package
    # import itself agrees with each answer.
    with pytest.raises(ModuleNotFoundError):
        __import__("no_such_pkg_here.models")
    with pytest.raises(RuntimeError, match="the package ran"):
        __import__("heavy_pkg.models")


def test_looking_for_torch_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "from app.contract.targets import missing_module\n"
        "assert missing_module('torch.nn.modules.linear:Linear') is None\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def vanishing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[TestClient, FakeRunner, Path]]:
    """A server whose registered factory module was there at start-up, then removed (a
    package uninstalled under a running server)."""
    code = tmp_path / "code"
    code.mkdir()
    module = code / "vanishing_models.py"
    module.write_text("def factory(): pass\n")
    monkeypatch.syspath_prepend(str(code))
    runner = FakeRunner()
    settings = Settings(
        jobs_db=tmp_path / "jobs.sqlite3", log_level="warning", check_models="gone=vanishing_models:factory"
    )
    with TestClient(create_app(settings, runner=runner)) as client:
        yield client, runner, module


def test_over_http_a_missing_module_is_a_422_at_model_and_no_rank_runs(
    vanishing: tuple[TestClient, FakeRunner, Path],
) -> None:
    client, runner, module = vanishing
    module.unlink()
    response = client.post("/v1/checks", json={"plan": PLAN, "model": "gone", "noise_scale": {"steps": 0}})
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert [e["pointer"] for e in problem["errors"]] == ["/model"]
    assert "no module named 'vanishing_models'" in problem["detail"]
    assert runner.orders == [] and client.get("/v1/checks").json()["checks"] == []


def test_over_http_a_module_that_is_there_is_taken(vanishing: tuple[TestClient, FakeRunner, Path]) -> None:
    """The control: the same request while the module is there reaches the runner."""
    client, runner, _ = vanishing
    response = client.post("/v1/checks", json={"plan": PLAN, "model": "gone", "noise_scale": {"steps": 0}})
    assert response.status_code == 202, response.text
    deadline = time.monotonic() + 10
    while not runner.orders:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert runner.orders[0].model_target == "vanishing_models:factory"


def _gradcheck(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m app.worker.gradcheck ARGS`, as a launcher starts a rank, here."""
    command = [sys.executable, "-m", "app.worker.gradcheck", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.slow
def test_the_rank_program_refuses_it_in_one_line_before_its_process_group(tmp_path: Path) -> None:
    """What torchrun starts on each node: no rendezvous is reachable here (MASTER_ADDR points
    nowhere), so a rank that got as far as its process group would hang or print a traceback."""
    pytest.importorskip("torch")
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "9",
    }
    request = json.dumps({"plan": PLAN})
    done = _gradcheck(
        env, "--request", request, "--model-factory", "no_such_pkg_here.models:resnet", "--timeout-s", "30"
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: --model-factory no_such_pkg_here.models:resnet: no module named 'no_such_pkg_here' in this "
        "environment; install its package here or add its folder to PYTHONPATH"
    ]
    registered = {**env, "BATCHPLAN_CHECK_MODELS": "resnet=no_such_pkg_here.models:resnet"}
    done = _gradcheck(registered, "--request", json.dumps({"plan": PLAN, "model": "resnet"}))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: /model: check model 'resnet' cannot be built here")
    assert "Traceback" not in done.stderr
    # A token model whose sequences are not the plan's length is refused the same way, before
    # the group, by every rank alike: tests/cli/test_check_models_cli.py's
    # test_a_token_factory_of_another_sequence_length_is_refused_by_the_ranks runs it on the
    # two ranks `batchplan check` starts (this rank program), which one process here cannot show.
