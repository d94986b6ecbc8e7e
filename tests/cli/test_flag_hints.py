"""The CLI's hints name what the user typed (issue 40, item 3): `try -b: 1024, ...` where the
user typed `-b`, `--global-batch-size` where they typed that, the long flag of a field they left
to its default, the part of the `--node-group` they wrote; a `--request` file keeps its field
names. An unknown flag is told the flag it meant (`--gpus`: `--gpus-per-node`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.cli import Invoke, both
from support.servers import Server

INFEASIBLE = ["--num-nodes", "2", "-b", "1000", "-m", "32"]


def _tries(stderr: str) -> dict[str, str]:
    """Each `try` line's flag (or a request file's field) and its values, comma-separated."""
    lines = [line.strip()[len("try ") :] for line in stderr.splitlines() if line.strip().startswith("try ")]
    tries = {}
    for line in lines:
        if ": " in line:  # a request file's field
            key, values = line.rsplit(": ", 1)
        else:
            typed = re.fullmatch(r"(.+?) (\S+)(?: \(or (.*)\))?", line)
            assert typed is not None, line
            key, values = typed[1], ", ".join(filter(None, [typed[2], typed[3]]))
        tries[key] = values
    return tries


@pytest.mark.parametrize("flag", ["-b", "--global-batch-size", "--global-batch-size="])
def test_a_suggestion_names_the_flag_as_typed(run: Invoke, flag: str) -> None:
    args = ["--num-nodes", "2", "-m", "32"]
    args += [flag + "1000"] if flag.endswith("=") else [flag, "1000"]
    out = run("plan", *args)
    assert out.exit_code == 2
    assert _tries(out.stderr) == {flag.rstrip("="): "1024, 512, 1536"}


def test_suggestions_for_flags_left_to_their_defaults_name_the_long_flag(run: Invoke) -> None:
    out = run("plan", "--gpus-per-node", "6", "--tensor", "4", "-b", "64")
    assert out.exit_code == 2
    tries = _tries(out.stderr)
    assert set(tries) == {"--tensor", "--gpus-per-node"}, out.stderr
    # Each value works when given to that flag.
    for flag, values in tries.items():
        for value in values.split(", "):
            args = {"--gpus-per-node": "6", "--tensor": "4", flag: value}
            assert run("plan", *(a for kv in args.items() for a in kv), "-b", "64").exit_code == 0


def test_a_schema_error_names_the_flag_in_the_error_and_the_suggestions(run: Invoke) -> None:
    out = run("plan", "-b", "-5")
    assert out.exit_code == 2
    assert out.stderr.splitlines()[0] == "error: -b: Input should be greater than or equal to 1"
    assert set(_tries(out.stderr)) == {"-b"}


def test_a_node_groups_field_is_named_by_the_node_group_typed(run: Invoke) -> None:
    out = run("plan", "--node-group", "a:1:8", "--node-group", "b:1:6", "--tensor", "4", "-b", "64")
    assert out.exit_code == 2
    tries = [line.strip() for line in out.stderr.splitlines() if line.strip().startswith("try ")]
    assert "try --node-group b:1:8 or --node-group b:1:24" in tries, out.stderr
    assert not [line for line in tries if "topology" in line or "." in line.split(" ")[1]]


def test_a_request_file_keeps_its_field_names_and_typed_export_flags_are_named(
    run: Invoke, tmp_path: Path
) -> None:
    path = tmp_path / "plan.json"
    infeasible = {"global_batch_size": 1000, "micro_batch_size": 32}
    path.write_text(json.dumps({"topology": {"num_nodes": 2, "gpus_per_node": 8}, **infeasible}))
    out = run("plan", "--request", str(path))
    assert _tries(out.stderr) == {"global_batch_size": "1024, 512, 1536"}
    # A plan flag typed beside --request is not what ran: the file's field is named.
    out = run("plan", "--request", str(path), "-b", "1024")
    assert _tries(out.stderr) == {"global_batch_size": "1024, 512, 1536"}
    path.write_text(json.dumps({"topology": {"num_nodes": 2, "gpus_per_node": 8}, "global_batch_size": 512}))
    out = run("export", "slurm", "--request", str(path), "--cpus-per-gpu", "999")
    assert _tries(out.stderr) == {"--cpus-per-gpu": "256"}


def test_the_same_flags_are_named_with_a_server(run: Invoke, server: Server) -> None:
    local, remote = both(run, server, "plan", *INFEASIBLE)
    assert local.stderr == remote.stderr
    assert _tries(remote.stderr) == {"-b": "1024, 512, 1536"}


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("--gpus", "--gpus-per-node"), ("--nodes", "--num-nodes"), ("--global-batch", "--global-batch-size")],
)
def test_an_unknown_flag_is_told_the_flag_it_meant(run: Invoke, typed: str, meant: str) -> None:
    out = run("plan", "-b", "64", typed, "8")
    assert out.exit_code == 2
    assert f"No such option: {typed}" in out.stderr
    assert meant in out.stderr.split(f"No such option: {typed}", 1)[1]
