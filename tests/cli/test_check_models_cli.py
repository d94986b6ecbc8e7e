"""`batchplan check` with the user's own model: a factory run in this environment, and a
registered name resolved from BATCHPLAN_CHECK_MODELS under torchrun."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.cli import Invoke

PLAN = ["--gpus-per-node", "2", "-b", "32"]
EXAMPLES = "app.worker.example_models"


@pytest.mark.slow
def test_a_factory_that_breaks_equivalence_fails_and_says_why(run: Invoke) -> None:
    out = run("check", *PLAN, "--model-factory", f"{EXAMPLES}:dropout_mlp", "--noise-steps", "0")
    assert out.exit_code == 1, out.stderr
    assert "not DDP-equivalent at this split: dropout" in out.stdout
    assert f"workload {EXAMPLES}:dropout_mlp" in out.stdout  # the model it ran, not "synthetic"
    assert "fix: run the check with dropout off" in out.stdout


@pytest.mark.slow
def test_a_registered_name_comes_from_the_environment_and_runs_under_torchrun(run: Invoke) -> None:
    """One local run (each starts its ranks cold) for what two showed: the name resolved from
    BATCHPLAN_CHECK_MODELS here, and the torchrun launcher's ranks measuring the model's noise
    scale. --model-factory reaches the same ranks by the same arguments whichever the launcher
    (app/cli/local_check.py); the factory's own run is test_a_factory_that_breaks_equivalence."""
    env = {"BATCHPLAN_CHECK_MODELS": f"ok={EXAMPLES}:quadratic"}
    out = run("check", *PLAN, "--model", "ok", "--launcher", "torchrun", env=env)
    assert out.exit_code == 0, out.stderr
    assert "model ok: DDP-equivalent at this split" in out.stdout
    noise = re.search(r"^gradient noise scale B_simple: (\S+) .*samples over (\d+) steps$", out.stdout, re.M)
    assert noise and float(noise.group(1)) > 0 and noise.group(2) == "8", out.stdout


def test_model_errors_say_what_to_change(run: Invoke) -> None:
    env = {"BATCHPLAN_CHECK_MODELS": f"ok={EXAMPLES}:mlp"}
    unknown = run("check", *PLAN, "--model", "okk", env=env)
    assert unknown.exit_code == 2 and "did you mean 'ok'" in unknown.stderr
    bad = run("check", *PLAN, "--model-factory", "not a target")
    assert bad.exit_code == 2 and "package.module:factory" in bad.stderr
    both = run("check", *PLAN, "--model", "ok", "--model-factory", f"{EXAMPLES}:mlp", env=env)
    assert both.exit_code == 2 and "not both" in both.stderr
    remote = run("check", *PLAN, "--model-factory", f"{EXAMPLES}:mlp", "--url", "http://127.0.0.1:9")
    assert remote.exit_code == 2 and "registered names" in remote.stderr


@pytest.mark.parametrize("launcher", ["direct", "torchrun"])
def test_a_factory_whose_module_is_not_here_is_refused_before_any_rank_starts(
    run: Invoke, monkeypatch: pytest.MonkeyPatch, launcher: str
) -> None:
    started: list[object] = []
    monkeypatch.setattr("app.cli.check.run_local_check", lambda *a, **k: started.append(a) or {})
    factory = run("check", *PLAN, "--model-factory", "no_such_pkg_here.models:f", "--launcher", launcher)
    assert factory.exit_code == 2, factory.stderr
    assert factory.stderr.startswith(
        "error: --model-factory no_such_pkg_here.models:f: no module named 'no_such_pkg_here'"
    )
    env = {"BATCHPLAN_CHECK_MODELS": "gone=no_such_pkg_here.models:f"}
    registered = run("check", *PLAN, "--model", "gone", "--launcher", launcher, env=env)
    assert registered.exit_code == 2, registered.stderr
    assert "check model 'gone' cannot be built here" in registered.stderr
    assert "no module named 'no_such_pkg_here'" in registered.stderr
    assert started == [], "ranks were started"


@pytest.mark.slow
def test_a_token_factory_of_another_sequence_length_is_refused_by_the_ranks(run: Invoke) -> None:
    """Here no probe has read the factory's sequences before the ranks start: the rank program
    (what torchrun starts) reads them and every rank refuses alike, in one line, exit 2."""
    plan = ["--gpus-per-node", "2", "--sequence-length", "32", "--global-batch-tokens", "128"]
    factory = ["--model-factory", "app.worker.example_models:tiny_language_model", "--workload", "tokens"]
    out = run("check", *plan, "--loss-normalization", "token", *factory)
    assert out.exit_code == 2, out.stderr
    assert "error: /plan/sequence_length: the model's sequences have 16 tokens" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_check_refuses_a_registered_model_in_the_request_beside_model_factory(
    run: Invoke, tmp_path: Path
) -> None:
    """--model in the request file and --model-factory: which would run was the file's model,
    while the command said it ran the factory. Both are refused, however --model came."""
    path = tmp_path / "check.json"
    plan = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}
    path.write_text(json.dumps({"plan": plan, "model": "mlp"}))
    env = {"BATCHPLAN_CHECK_MODELS": "mlp=app.worker.example_models:mlp"}
    out = run("check", "--request", str(path), "--model-factory", "app.worker.example_models:mlp", env=env)
    assert out.exit_code == 2
    assert "not both" in out.stderr and "mlp" in out.stderr
