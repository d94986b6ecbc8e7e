"""Every kind of suggestion the CLI prints, walked: for each command that builds its request from
flags (plan, export, check, measure, a scaling law's plan, and through --url), an error names
the flags typed, never the request's fields, and each `try` line is arguments in one form
(`--resume-at 7`, `-b 1024 (or 512, 1536)`, a whole `--node-group`) that, typed, are taken.

A check or measure that is taken reaches its run: the test stops it there (the run itself is
the rank tests' subject), so no rank starts."""

from __future__ import annotations

import re
from typing import Any

import pytest
from support.cli import Invoke
from support.servers import Server

RESUME = ["--num-nodes", "1", "--gpus-per-node", "4", "-b", "12", "-m", "3", "--num-samples", "100"]
RESUME += ["--epochs", "2", "--drop-last", "--no-shuffle"]
LAW = ["--law", "step_law", "--params", "1.2e9", "--train-tokens", "1e11", "--sequence-length", "2048"]
SHAPE = ["--layers", "16", "--hidden-size", "2048", "--ffn-hidden-size", "8192", "--num-heads", "12"]
PROBE_LR = ["--base-lr", "0.01", "--base-batch-size", "16", "--rule", "linear"]
TWO_GPUS = ["--gpus-per-node", "2", "-b", "64"]
TENSOR_4 = ["--tensor", "4", "-b", "64"]
CPUS_999 = ["--cpus-per-gpu", "999"]
RESUME_AT_19 = ["--resume-at", "19", "--resume-replicas", "1"]
REACHED_RUN = 99  # the exit status of a check that got as far as running

CASES = {
    "plan, the batch": ["plan", "--num-nodes", "2", "-b", "1000", "-m", "32"],
    "plan, the model-parallel split": ["plan", "--gpus-per-node", "6", "--tensor", "4", "-b", "64"],
    "plan, a node group": ["plan", "--node-group", "a:1:8", "--node-group", "b:1:6", *TENSOR_4],
    "plan, a schema error": ["plan", "--gpus-per-node", "8", "--global-batch-size", "-5"],
    "plan, a resume past the end": ["plan", *RESUME, "--resume-step", "18"],
    "plan, a law's model shape": ["plan", *LAW[:2], *SHAPE, *LAW[4:]],
    "export, its own option": ["export", "slurm", "--gpus-per-node", "8", "-b", "512", *CPUS_999],
    "check, the batch": ["check", "--num-nodes", "2", "-b", "1000", "-m", "32"],
    "check, the resume step": ["check", *TWO_GPUS, "--steps", "8", *RESUME_AT_19, "--base-lr", "0.1"],
    "check, the probe's samples": ["check", *TWO_GPUS, *PROBE_LR, "--lr-scaling", "8"],
    "check, the probe's seeds": ["check", *TWO_GPUS, *PROBE_LR, "--lr-scaling", "4096", "--lr-seeds", "99"],
    "measure, the batch": ["measure", "--num-nodes", "2", "-b", "1000", "-m", "32"],
}


@pytest.fixture
def stop_at_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import typer

    def reached(*args: Any, **kwargs: Any) -> None:
        raise typer.Exit(REACHED_RUN)

    monkeypatch.setattr("app.cli.check.run_local_check", reached)


def tries(stderr: str) -> list[str]:
    return [line.strip()[len("try ") :] for line in stderr.splitlines() if line.strip().startswith("try ")]


def alternatives(line: str) -> list[list[str]]:
    """A `try` line's arguments, one list per alternative."""
    listed = re.fullmatch(r"(-\S+) (\S+) \(or (.*)\)", line)
    if listed is not None:
        return [[listed[1], value] for value in [listed[2], *listed[3].split(", ")]]
    return [alternative.split(" ") for alternative in line.split(" or ")]


def applied(args: list[str], alternative: list[str]) -> list[str]:
    """`args` with the alternative's flag set as it says (a node group replaced by its name)."""
    flag, *value = alternative
    out = list(args)
    if flag == "--node-group":
        name = value[0].split(":")[0]
        at = next(i for i, a in enumerate(out) if a.startswith(name + ":") and out[i - 1] == flag)
        out[at] = value[0]
        return out
    if flag in out:
        at = out.index(flag)
        del out[at : at + 1 + len(value)]
    return [*out, flag, *value]


def assert_in_flags(args: list[str], stderr: str) -> None:
    """No request field where a flag set it: not in the error, not in a suggestion."""
    fields = {a[2:].replace("-", "_") for a in args if a.startswith("--") and "-" in a[2:]}
    fields |= {"plan.", "resume.", "lr_scaling.", "learning_rate", "topology.", "dataset."}
    named = [f for f in fields if re.search(rf"(?<![\w-]){re.escape(f)}", stderr)]
    assert not named, (named, stderr)
    for line in tries(stderr):
        assert line.startswith("-") and ":" not in line.split(" ")[0], line


@pytest.mark.parametrize("case", list(CASES))
def test_every_suggestion_names_flags_and_is_taken(run: Invoke, stop_at_the_run: None, case: str) -> None:
    args = CASES[case]
    out = run(*args)
    assert out.exit_code == 2, out
    assert tries(out.stderr), out.stderr
    assert_in_flags(args, out.stderr)
    taken = REACHED_RUN if args[0] in ("check", "measure") else 0
    for line in tries(out.stderr):
        for alternative in alternatives(line):
            again = run(*applied(args, alternative))
            assert again.exit_code == taken, (line, alternative, again.stderr)


def test_the_same_through_a_server(run: Invoke, server: Server) -> None:
    args = CASES["plan, the batch"]
    out = run(*args, "--url", server.url)
    assert out.exit_code == 2 and tries(out.stderr) == ["-b 1024 (or 512, 1536)"], out.stderr
    assert_in_flags(args, out.stderr)
    assert run(*applied(args, ["-b", "512"]), "--url", server.url).exit_code == 0
