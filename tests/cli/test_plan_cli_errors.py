"""`batchplan plan`'s errors: the same locally and from a real server, with the suggestions, and
the usage errors of malformed flags, request files and an unreachable server."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli import Invoke, both
from support.servers import Server, free_port

ERRORS = {
    "infeasible": ["plan", "--num-nodes", "2", "-b", "1000", "-m", "32"],
    "schema": ["plan", "-b", "0"],
    "both_topologies": ["plan", "--node-group", "a:1:8", "--num-nodes", "2", "-b", "64"],
    "bad_group_value": ["plan", "--node-group", "a:0:8", "-b", "64"],
    "model_parallel": ["plan", "--gpus-per-node", "6", "--tensor", "4", "-b", "64"],
    "unknown_format": ["plan", "--format", "ray", "-b", "64"],
    "bad_export_option": ["export", "slurm", "-b", "64", "--job-name", "Not_A_Label"],
    "export_unsupported": [
        "export",
        "deepspeed",
        "--node-group",
        "h:1:2:2",
        "--node-group",
        "a:1:2",
        "-b",
        "60",
    ],
    "warmup_needs_dataset": ["plan", "-b", "64", "--base-lr", "0.1", "--warmup-epochs", "1"],
}


@pytest.mark.parametrize("name", ERRORS)
def test_errors_are_the_same_both_ways(run: Invoke, server: Server, name: str) -> None:
    local, remote = both(run, server, *ERRORS[name])
    assert local.exit_code == remote.exit_code == 2
    assert local.stdout == remote.stdout == ""
    assert local.stderr == remote.stderr
    assert local.stderr.startswith("error: ")


def test_errors_print_the_suggestions(run: Invoke) -> None:
    out = run(*ERRORS["infeasible"])
    assert out.exit_code == 2
    assert out.stderr.splitlines() == [
        "error: -b 1000 is not a multiple of micro 32 x 16 replicas = 512",
        "  try -b 1024 (or 512, 1536)",
    ]
    model_parallel = run(*ERRORS["model_parallel"])
    # 6 GPUs on one node with tensor 4: GPU counts and tensor sizes, each named by its flag.
    assert "  try --gpus-per-node 4 (or 8, 16)" in model_parallel.stderr.splitlines()
    assert "  try --tensor 3 (or 6)" in model_parallel.stderr.splitlines()
    unsupported = run(*ERRORS["export_unsupported"])
    assert "try " in unsupported.stderr


def test_a_malformed_node_group_is_a_usage_error(run: Invoke) -> None:
    out = run("plan", "--node-group", "h100:2", "-b", "64")
    assert out.exit_code == 2
    assert "NAME:NODES:GPUS_PER_NODE" in out.stderr
    assert run("plan", "--node-group", "h100:2:x", "-b", "64").exit_code == 2


def test_request_file_errors(run: Invoke, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    out = run("plan", "--request", str(bad))
    assert out.exit_code == 2 and "is not valid JSON" in out.stderr
    missing = run("plan", "--request", str(tmp_path / "nope.json"))
    assert missing.exit_code == 2 and "cannot read" in missing.stderr


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b'{\n "topology": \xff}', "byte 0xff is not UTF-8 (invalid start byte) at line 2, column 14"),
        (b"[" * 5_000 + b"]" * 5_000, "nested at least"),
    ],
)
def test_a_request_file_that_is_not_json_says_what_and_where_as_the_server_does(
    run: Invoke, tmp_path: Path, content: bytes, said: str
) -> None:
    """Not a traceback: the CLI reads a file as the server reads a body (core.json_text)."""
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    out = run("plan", "--request", str(bad))
    assert out.exit_code == 2 and "is not valid JSON" in out.stderr and said in out.stderr, out.stderr


def test_an_unreachable_server_exits_2(run: Invoke) -> None:
    out = run("plan", "-b", "64", "--url", f"http://127.0.0.1:{free_port()}")
    assert out.exit_code == 2
    assert out.stderr.startswith("error: cannot reach http://127.0.0.1:")
