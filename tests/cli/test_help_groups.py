"""`--help` lists each command's options under its groups, in one fixed order, every option
under exactly one group; and `measure` is not offered the flags a measurement has no use for."""

from __future__ import annotations

import re

import pytest
import typer
from support.cli import Invoke
from typer.core import TyperGroup, TyperOption

from app.cli import cli
from app.cli.help_panels import ORDER, OTHER

COMMAND = typer.main.get_command(cli)
assert isinstance(COMMAND, TyperGroup)
COMMANDS = COMMAND.commands
# What measure times is one replica's micro-steps: a resume, the lr-scaling probe (run, or
# its result read) and the noise scale's steps would not change it.
NOT_MEASURED = (
    "--resume-step",
    "--resume-samples",
    "--resume-replicas",
    "--resume-at",
    "--lr-scaling",
    "--lr-rules",
    "--label-noise",
    "--lr-epochs",
    "--lr-seeds",
    "--lr-tolerance",
    "--lr-tolerance-unit",
    "--lr-scaling-result",
    "--lr-scaling-check",
    "--lr-chart",
    "--noise-steps",
    "--noise-lr",
)


def _sections(text: str) -> dict[str, str]:
    """The help's sections by heading (a line `Heading:` at the margin), in the order shown."""
    parts = re.split(r"^(\S[^\n]*):\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.mark.parametrize("name", ["plan", "export", "check", "measure"])
def test_every_option_is_under_exactly_one_group_in_the_fixed_order(run: Invoke, name: str) -> None:
    out = run(name, "--help")
    assert out.exit_code == 0, out.stderr
    sections = _sections(out.stdout)
    headings = [h for h in sections if h in ORDER]
    assert headings == sorted(headings, key=ORDER.index) and headings[-1] == OTHER, list(sections)
    assert {"Cluster", "Batch", "Data", "Output/Server"} <= set(headings)
    for param in COMMANDS[name].params:
        if not isinstance(param, TyperOption):
            continue
        long = next(opt for opt in param.opts if opt.startswith("--"))
        flag = rf"^  (-\w, )?{re.escape(long)}(?![\w-])"
        where = [h for h, body in sections.items() if re.search(flag, body, re.M)]
        assert where == [param.rich_help_panel], (name, param.opts, where)
    # Only --help has no group of its own.
    assert re.findall(r"^  (-\S+)", sections[OTHER], re.M) == ["--help"]


def test_check_has_the_probe_group_and_measure_its_own(run: Invoke) -> None:
    check = _sections(run("check", "--help").stdout)
    measure = _sections(run("measure", "--help").stdout)
    assert "Probe" in check and "Measure" not in check
    assert "Measure" in measure and "Probe" not in measure


def test_measure_offers_none_of_the_resume_probe_or_noise_flags(run: Invoke) -> None:
    text = run("measure", "--help").stdout
    check = run("check", "--help").stdout
    for flag in NOT_MEASURED:
        pattern = rf"(?<![\w-]){re.escape(flag)}(?![\w-])"
        assert not re.search(pattern, text), flag
        assert re.search(pattern, check), flag  # check still offers it
    refused = run("measure", "--gpus-per-node", "2", "-b", "16", "--resume-at", "1")
    assert refused.exit_code == 2 and "No such option: --resume-at" in refused.stderr
