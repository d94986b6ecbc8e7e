"""What a newcomer reads first: `--help` of every command (at 80 columns, every option whole
and explained), the sampler flags, and the two seeds (`--data-seed` and the check's `--seed`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from support.cli import Invoke
from support.servers import ROOT
from typer.core import TyperGroup, TyperOption

from app.cli import cli

COMMAND = typer.main.get_command(cli)
assert isinstance(COMMAND, TyperGroup)
COMMANDS = sorted(COMMAND.commands)


def _help_at_80_columns(*command: str) -> str:
    """`batchplan [COMMAND] --help` as the installed script prints it in an 80-column terminal."""
    exe = Path(sys.executable).parent / "batchplan"
    out = subprocess.run(
        [str(exe), *command, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "80"},
        timeout=60,
        check=True,
    )
    return out.stdout


@pytest.mark.parametrize("name", COMMANDS)
def test_help_at_80_columns_shows_every_option_whole_with_its_help(name: str) -> None:
    text = _help_at_80_columns(name)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    # The option column: the lines that start with a flag (help text starts further right).
    flag_lines = "\n".join(line for line in text.splitlines() if line.startswith("  -"))
    params = [p for p in COMMAND.commands[name].params if isinstance(p, TyperOption) and not p.hidden]
    assert params
    for param in params:
        for flag in (*param.opts, *param.secondary_opts):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", flag_lines), f"{flag} cut:\n{text}"
        assert param.help and param.help.strip(), f"{name} {param.opts} has no help"


def test_the_command_list_fits_80_columns() -> None:
    text = _help_at_80_columns()
    assert all(len(line) <= 80 for line in text.splitlines())
    for name in COMMANDS:
        assert re.search(rf"^  {name} +\S", text, re.MULTILINE), text


def test_the_batch_shorthands_are_explained(run: Invoke) -> None:
    text = run("plan", "--help").stdout
    assert re.search(r"-b, --global-batch-size <int> +Samples per optimizer step", text)
    assert re.search(r"-m, --micro-batch-size <int> +Samples per GPU", text)
    assert re.search(r"-g, --accumulation <int> +Gradient accumulation steps", text)


def _sampler(run: Invoke, *flags: str) -> dict[str, object]:
    out = run("plan", "-b", "64", "--num-samples", "1000", "--json", *flags)
    assert out.exit_code == 0, out.stderr
    sampler = json.loads(out.stdout)["sampler"]
    assert isinstance(sampler, dict)
    return sampler


def test_shuffle_and_no_shuffle(run: Invoke) -> None:
    assert _sampler(run)["shuffle"] is True
    assert _sampler(run, "--shuffle")["shuffle"] is True
    assert _sampler(run, "--no-shuffle")["shuffle"] is False
    gone = run("plan", "-b", "64", "--num-samples", "1000", "--no-no-shuffle")
    assert gone.exit_code == 2 and "No such option: --no-no-shuffle" in gone.stderr
    assert "--no-no-shuffle" not in run("plan", "--help").stdout


def test_data_seed_is_the_sampler_seed_in_plan_and_export(run: Invoke) -> None:
    assert _sampler(run)["seed"] == 0
    assert _sampler(run, "--data-seed", "7")["seed"] == 7
    script = run("export", "python", "-b", "64", "--num-samples", "1000", "--data-seed", "7", "--no-shuffle")
    assert script.exit_code == 0, script.stderr
    assert "SHUFFLE, SEED, DROP_LAST = False, 7, False" in script.stdout
    # `--seed` means the check's seed, so plan and export (which have none) refuse it.
    seed = run("plan", "-b", "64", "--num-samples", "1000", "--seed", "7")
    assert seed.exit_code == 2 and "No such option: --seed" in seed.stderr and "--data-seed" in seed.stderr


def test_on_check_seed_and_data_seed_land_in_their_own_fields(run: Invoke) -> None:
    """Validated as the server validates a check request: each flag's error lands in its own
    field (`seed`, `plan.dataset.seed`) and names the flag the user typed."""
    plan = ["--gpus-per-node", "2", "-b", "16", "--num-samples", "64"]
    seed = run("check", *plan, "--seed", "-1")
    assert seed.exit_code == 2 and seed.stderr.startswith("error: --seed: "), seed.stderr
    data_seed = run("check", *plan, "--data-seed", "-1")
    assert data_seed.exit_code == 2 and data_seed.stderr.startswith("error: --data-seed: "), data_seed.stderr


def test_the_version_is_the_installed_packages(run: Invoke) -> None:
    from importlib.metadata import version

    out = run("--version")
    assert (out.exit_code, out.stdout) == (0, f"batchplan {version('batchplan')}\n")


def test_the_readme_asks_for_the_python_pyproject_takes() -> None:
    import tomllib

    root = Path(__file__).resolve().parents[2]
    wanted = tomllib.loads((root / "pyproject.toml").read_text())["project"]["requires-python"]
    least = re.fullmatch(r">=(\d+\.\d+)", wanted)
    assert least is not None, wanted
    assert f"You need Python {least[1]} or newer" in (root / "README.md").read_text()
