"""`batchplan plan` / `export`: the same output computed here and by a real server (the
errors: test_plan_cli_errors.py)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from support.cli import Invoke, both
from support.servers import ROOT, Server

from app.core.exports.registry import EXPORTERS
from app.schemas.examples import plan_example

# ImageNet on 16 GPUs (plan_example("dataset_and_lr")): the plan and the exports say the same.
IMAGENET_FLAGS = ["--num-nodes", "2", "-b", "512", "--num-samples", "1281167"]
FLAG_REQUESTS = {
    "homogeneous": ["--num-nodes", "2", "--gpus-per-node", "8", "-b", "512"],
    "dataset_and_lr": [
        *IMAGENET_FLAGS,
        "--epochs",
        "90",
        "--base-lr",
        "0.1",
        "--warmup-epochs",
        "5",
    ],
    "round_down": ["--num-nodes", "2", "-b", "1000", "-m", "32", "--divisibility", "round_down"],
    "megatron": [
        "--num-nodes",
        "4",
        "--tensor",
        "4",
        "--pipeline",
        "2",
        "-b",
        "1024",
        "--max-micro-batch-size",
        "16",
        "--base-lr",
        "3e-4",
        "--optimizer",
        "adamw",
        "--warmup-steps",
        "2000",
    ],
    "node_group_flags": [
        "--node-group",
        "h100:2:8:2.0:64",
        "--node-group",
        "a100:1:4:1:32",
        "-b",
        "1000",
        "--num-samples",
        "100000",
    ],
    "balance_sum": [
        "--gpus-per-node",
        "6",
        "-b",
        "100",
        "--divisibility",
        "balance",
        "--loss-reduction",
        "sum",
    ],
    # The OpenAPI example `language_model`, flag by flag (test_token_flags_are_the_example_body).
    "language_model": [
        *("--num-nodes", "4", "--tensor", "2", "--sequence-length", "4096"),
        *("--global-batch-tokens", "4194304", "--micro-batch-tokens", "8192"),
        *("--loss-normalization", "token", "--num-samples", "2000000", "--epochs", "1"),
        *("--base-lr", "3e-4", "--base-batch-tokens", "1048576", "--optimizer", "adamw"),
        *("--rule", "sqrt", "--warmup-steps", "99", "--warmup-start-lr", "6e-6"),
    ],
}


@pytest.fixture
def mixed_file(tmp_path: Path) -> Path:
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(plan_example("mixed")))
    return path


def test_token_flags_are_the_example_body(run: Invoke, tmp_path: Path) -> None:
    path = tmp_path / "language_model.json"
    path.write_text(json.dumps(plan_example("language_model")))
    from_flags = run("plan", *FLAG_REQUESTS["language_model"], "--json")
    from_body = run("plan", "--request", str(path), "--json")
    assert from_flags.exit_code == from_body.exit_code == 0, (from_flags.stderr, from_body.stderr)
    assert from_flags.stdout == from_body.stdout
    assert json.loads(from_flags.stdout)["tokens"]["tokens_per_step"] == 4194304


@pytest.mark.parametrize("name", FLAG_REQUESTS)
def test_local_and_server_give_identical_json(run: Invoke, server: Server, name: str) -> None:
    local, remote = both(run, server, "plan", *FLAG_REQUESTS[name], "--json")
    assert local.exit_code == remote.exit_code == 0, (local.stderr, remote.stderr)
    assert local.stdout == remote.stdout
    assert json.loads(local.stdout)["global_batch_size"] > 0


def test_mixed_cluster_from_a_request_file(run: Invoke, server: Server, mixed_file: Path) -> None:
    local, remote = both(run, server, "plan", "--request", str(mixed_file), "--format", "json")
    assert local.exit_code == remote.exit_code == 0, (local.stderr, remote.stderr)
    assert local.stdout == remote.stdout
    result = json.loads(local.stdout)
    assert result["world_size"] == 20 and result["micro_batch_size"] is None
    assert [g["node_group"] for g in result["replica_groups"]] == ["h100", "h100", "a100"]
    # --node-group flags build the same request
    flags = run("plan", *FLAG_REQUESTS["node_group_flags"], "--json")
    assert json.loads(flags.stdout) == result


def test_table_is_the_default_and_the_same_both_ways(run: Invoke, server: Server, mixed_file: Path) -> None:
    local, remote = both(run, server, "plan", "--request", str(mixed_file))
    assert local.exit_code == remote.exit_code == 0
    assert local.stdout == remote.stdout
    assert "world size 20, model-parallel 1, data-parallel 20" in local.stdout
    assert "micro per group" in local.stdout
    assert "a100" in local.stdout and "sampler proportional" in local.stdout


@pytest.mark.parametrize("fmt", list(EXPORTERS))
def test_every_export_format_is_the_same_both_ways(run: Invoke, server: Server, fmt: str) -> None:
    args = [
        *IMAGENET_FLAGS,
        "--base-lr",
        "0.1",
        "--warmup-epochs",
        "5",
        "--script",
        "main.py",
        "--job-name",
        "resnet",
        "--master-port",
        "29600",
    ]
    if fmt == "torchtitan":  # it builds Adam only, and warms up from lr / (warmup + 1) only
        args = [*args[:8], "--optimizer", "adamw", *args[10:]]
    local, remote = both(run, server, "plan", "--format", fmt, *args)
    assert local.exit_code == remote.exit_code == 0, (local.stderr, remote.stderr)
    assert local.stdout == remote.stdout
    assert run("export", fmt, *args).stdout == local.stdout
    text = local.stdout
    if fmt == "deepspeed":
        assert json.loads(text)["train_batch_size"] == 512
    elif fmt in ("kubernetes", "accelerate"):
        assert yaml.safe_load(text)
    elif fmt in ("python", "hf-trainer", "lightning"):
        ast.parse(text)
    elif fmt == "torchtitan":
        assert tomllib.loads(text)["training"]["global_batch_size"] == 512
    elif fmt == "megatron":
        assert "--global-batch-size 512" in text
    else:
        assert "main.py" in text and "29600" in text


def test_export_to_a_file(run: Invoke, tmp_path: Path) -> None:
    target = tmp_path / "ds.json"
    out = run("export", "deepspeed", "-b", "64", "-o", str(target))
    assert out.exit_code == 0 and out.stdout == ""
    assert json.loads(target.read_text())["train_batch_size"] == 64


def test_the_installed_entry_point(server: Server, mixed_file: Path) -> None:
    """Once as a real process: the `batchplan` script that `pip install -e .` puts in the venv."""
    exe = Path(sys.executable).parent / "batchplan"
    assert exe.exists(), "pip install -e . puts it there"
    local = subprocess.run(
        [str(exe), "plan", "--request", str(mixed_file), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    remote = subprocess.run(
        [str(exe), "plan", "--request", str(mixed_file), "--json", "--url", server.url],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert local.returncode == remote.returncode == 0, (local.stderr, remote.stderr)
    assert local.stdout == remote.stdout
    failing = subprocess.run(
        [str(exe), "plan", "--num-nodes", "2", "-b", "1000", "-m", "32"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert failing.returncode == 2
    assert "try -b 1024 (or 512, 1536)" in failing.stderr


def test_the_recipe_flags_are_the_learning_rate_fields(run: Invoke) -> None:
    recipe = {
        "--warmup-steps": "2",
        "--warmup-start-lr": "0",
        "--decay": "cosine",
        "--min-lr": "0.01",
        "--train-steps": "20",
        "--momentum": "0.8",
        "--weight-decay": "0.1",
        "--max-grad-norm": "1.0",
    }
    flags = [word for pair in recipe.items() for word in pair]
    out = run(
        "plan", "--gpus-per-node", "2", "-b", "8", "--base-lr", "0.1", "--rule", "none", *flags, "--json"
    )
    assert out.exit_code == 0, out.stderr
    lr = json.loads(out.stdout)["learning_rate"]
    assert (lr["warmup_steps"], lr["warmup_start_lr"], lr["decay"], lr["min_lr"]) == (2, 0.0, "cosine", 0.01)
    assert (lr["train_steps"], lr["momentum"], lr["weight_decay"], lr["max_grad_norm"]) == (20, 0.8, 0.1, 1.0)
    assert lr["lr_at_last_step"] == 0.01


def test_a_stream_is_planned_from_its_flags(run: Invoke) -> None:
    flags = ("--num-nodes", "1", "--gpus-per-node", "4", "-b", "32", "-m", "4", "--stream")
    sized = ("--num-shards", "8", "--num-samples", "4096")
    out = run("plan", *flags, *sized, "--splitter", "rank_worker", "--json")
    stream = json.loads(out.stdout)["stream"]
    assert out.exit_code == 0 and stream["splitter"] == "rank_worker", out.stderr
    out = run(
        "plan", *flags, "--shard-samples", "30,20,10,10", "--splitter", "webdataset", "--num-workers", "2"
    )
    assert out.exit_code == 0, out.stderr
    assert "stream webdataset: 4 shards over 8 readers, end_of_epoch drop" in out.stdout
    refused = run("plan", *flags, *sized)
    assert refused.exit_code == 2 and "every rank" in refused.stderr
