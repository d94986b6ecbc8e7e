"""docs/cli.md names every command, and every `batchplan` line the docs show parses: each flag
is one the command has (none runs: click reads the arguments only). The lr-scaling page's CLI
line sends the very request of its HTTP example."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
from support.cli import Invoke
from typer.main import get_command

from app.cli import cli

DOCS = Path(__file__).resolve().parents[2] / "docs"


def documented_lines(page: Path) -> list[str]:
    """The `batchplan ...` command lines of a page's sh blocks, continuations joined."""
    lines: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", page.read_text(), re.S):
        for raw in block.replace("\\\n", " ").splitlines():
            line = raw.split("  #")[0].strip()
            if line.startswith("batchplan "):
                lines.append(line)
    return lines


def test_the_cli_page_names_every_command_and_each_of_its_lines_parses() -> None:
    group = get_command(cli)
    text = (DOCS / "cli.md").read_text()
    for name in group.commands:  # type: ignore[attr-defined]
        assert f"batchplan {name}" in text, name
    for line in documented_lines(DOCS / "cli.md"):
        args = shlex.split(line)[1:]
        if args == ["--version"]:
            continue
        command = group.commands[args[0]]  # type: ignore[attr-defined]
        command.make_context(args[0], args[1:], resilient_parsing=False)  # a wrong flag raises


def test_the_lr_scaling_pages_cli_line_sends_its_http_example(
    run: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = (DOCS / "lr-scaling.md").read_text()
    sent = json.loads(re.search(r"curl -si http://127.0.0.1:8000/v1/checks .*?-d '(\{.*?\})'", page, re.S)[1])  # type: ignore[index]
    line = re.search(r"`(batchplan check --gpus-per-node [^`]*)`", page.replace("\n", " "))[1]  # type: ignore[index]
    asked: dict[str, Any] = {}

    def captured(stored: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        asked.update(stored)
        raise typer.Exit(0)

    monkeypatch.setattr("app.cli.check.run_local_check", captured)
    out = run(*shlex.split(line)[1:])
    assert out.exit_code == 0, out.stderr
    # The same length: the HTTP example leaves samples out (the plan's whole run, train_samples).
    whole = sent["plan"]["learning_rate"]["train_samples"]
    assert asked["lr_scaling"].get("samples", whole) == sent["lr_scaling"].get("samples", whole)
    for key, value in sent["plan"]["learning_rate"].items():
        assert asked["plan"]["learning_rate"][key] == value, key
    assert asked["plan"]["topology"]["gpus_per_node"] == sent["plan"]["topology"]["gpus_per_node"]
    assert asked["plan"]["global_batch_size"] == sent["plan"]["global_batch_size"]
