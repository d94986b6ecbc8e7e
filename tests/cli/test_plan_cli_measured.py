"""`batchplan plan` with what was measured: --throughput-curve (issue 38) and an lr-scaling
probe's result, --lr-scaling-result / --lr-scaling-check (issue 39's plan side). The flags build
the documented example bodies, and the table shows the predicted times and the measured rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import Invoke, both
from support.servers import Server

from app.schemas.examples import plan_example

CURVE_FLAGS = [
    *("--node-group", "h100:2:8::64", "--node-group", "a100:1:4::32"),
    *("--throughput-curve", "h100=8:960,16:1840,32:2600,64:2700"),
    *("--throughput-curve", "a100=8:520,16:880,32:1000"),
    *("-b", "1024", "--num-samples", "100000"),
]
LR_FLAGS = [
    *("--num-nodes", "1", "-b", "512", "--base-lr", "0.1", "--base-batch-size", "64"),
    *("--warmup-steps", "100", "--train-steps", "2000"),
]


def _file(tmp_path: Path, name: str, data: object) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_curve_flags_are_the_example_body_and_the_table_shows_the_prediction(
    run: Invoke, server: Server, tmp_path: Path
) -> None:
    request = _file(tmp_path, "curves.json", plan_example("mixed_curves"))
    from_flags = run("plan", *CURVE_FLAGS, "--json")
    from_body = run("plan", "--request", request, "--json")
    assert from_flags.exit_code == from_body.exit_code == 0, (from_flags.stderr, from_body.stderr)
    assert from_flags.stdout == from_body.stdout
    plan = json.loads(from_flags.stdout)
    local, remote = both(run, server, "plan", *CURVE_FLAGS)
    assert local.exit_code == remote.exit_code == 0 and local.stdout == remote.stdout
    t = plan["throughput"]
    assert f"predicted from the curves: step {t['predicted_step_s']:.4g} s" in local.stdout
    for g in plan["replica_groups"]:
        assert f"micro-batch {g['micro_batch_size']} in {g['predicted_micro_step_s']:.4g} s" in local.stdout


def test_a_homogeneous_curve_flag(run: Invoke) -> None:
    out = run(
        "plan",
        "--num-nodes",
        "1",
        "-b",
        "512",
        "--max-micro-batch-size",
        "64",
        "--throughput-curve",
        "16:2000,32:2600,64:2200",
        "--json",
    )
    assert out.exit_code == 0, out.stderr
    plan = json.loads(out.stdout)
    assert (plan["micro_batch_size"], plan["gradient_accumulation_steps"]) == (32, 2)


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("8:960,16", "MICRO:SAMPLES_PER_S"),
        ("h100=8:960", "needs --node-group"),
    ],
)
def test_a_malformed_curve_flag_is_a_usage_error(run: Invoke, flag: str, says: str) -> None:
    out = run("plan", "-b", "64", "--throughput-curve", flag)
    assert out.exit_code == 2 and says in out.stderr, out.stderr


def test_a_curve_flag_for_no_such_group(run: Invoke) -> None:
    out = run("plan", "--node-group", "h100:1:8", "-b", "64", "--throughput-curve", "a100=8:960")
    assert out.exit_code == 2 and "one of h100" in out.stderr, out.stderr


@pytest.mark.parametrize("shape", ["check", "result", "lr_scaling"])
def test_a_probe_result_file_is_the_measured_example(run: Invoke, tmp_path: Path, shape: str) -> None:
    example = plan_example("measured_lr")
    probe = example["learning_rate"]["lr_scaling"]
    data = {
        "check": {"id": "abc", "status": "succeeded", "result": {"passed": True, "lr_scaling": probe}},
        "result": {"passed": True, "lr_scaling": probe},
        "lr_scaling": probe,
    }[shape]
    out = run("plan", *LR_FLAGS, "--lr-scaling-result", _file(tmp_path, "probe.json", data), "--json")
    expected = run("plan", "--request", _file(tmp_path, "example.json", example), "--json")
    assert out.exit_code == expected.exit_code == 0, (out.stderr, expected.stderr)
    assert out.stdout == expected.stdout
    table = run("plan", *LR_FLAGS, "--lr-scaling-result", _file(tmp_path, "probe.json", data)).stdout
    assert "lr rule linear: measured best by the lr-scaling probe" in table


def test_a_check_id_without_a_server_says_to_give_the_result(run: Invoke) -> None:
    out = run("plan", *LR_FLAGS, "--lr-scaling-check", "abc")
    assert out.exit_code == 2
    assert "--lr-scaling-result" in out.stderr and "--url" in out.stderr, out.stderr
