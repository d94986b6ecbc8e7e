"""`batchplan check --lr-scaling SAMPLES`: the probe on a server's warm ranks (--url), printed
as one row a run and the verdict, its chart saved with --lr-chart.

Not here as well: a check here sends the same body (app/cli/check.py's check_body) to ranks
it starts, whose rank program runs it with the warm ranks' run_spec and nothing of its own per
kind of check; tests/cli/test_check_cli.py's test_check_locally proves those ranks start and
answer, and tests/cli/test_check_run_cli.py runs a check of several steps here. A probe here
started two more cold ranks to print what the server's run prints."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli import Invoke, on
from support.servers import Server

PROBE = [
    "--gpus-per-node",
    "2",
    "-b",
    "64",
    "--base-lr",
    "0.01",
    "--base-batch-size",
    "16",
    "--rule",
    "linear",
]


def _assert_probe_output(stdout: str) -> None:
    assert "lr scaling over 4,096 samples" in stdout, stdout
    rows = [line.split() for line in stdout.splitlines() if line.startswith("  ")]
    runs = {row[0]: row for row in rows if row and row[0] in {"base", "none", "sqrt", "linear"}}
    assert set(runs) == {"base", "sqrt", "linear"}, stdout  # --lr-rules sqrt (linear: the plan's)
    assert runs["base"][1:3] == ["16", "0.01"] and runs["linear"][1:3] == ["64", "0.04"]
    assert "the plan's" in " ".join(runs["linear"])
    verdict = next(line for line in stdout.splitlines() if line.startswith("verdict: "))
    assert verdict.startswith("verdict: at 64, ") and "16-sample run over 4,096 samples" in verdict


@pytest.mark.slow
def test_the_probe_on_a_server(run: Invoke, worker_server: Server, tmp_path: Path) -> None:
    chart = tmp_path / "lr.svg"
    args = ["--lr-scaling", "4096", "--lr-rules", "sqrt", "--lr-chart", str(chart)]
    out = run("check", *PROBE, *args, *on(worker_server))
    assert out.exit_code == 0, out.stderr
    _assert_probe_output(out.stdout)
    assert chart.read_bytes().startswith(b"<?xml") and f"wrote {chart}" in out.stderr


def test_a_probe_without_a_learning_rate_is_refused_at_its_field(run: Invoke) -> None:
    out = run("check", "--gpus-per-node", "2", "-b", "64", "--lr-scaling", "4096")
    assert out.exit_code == 2 and "give --base-lr" in out.stderr, out.stderr
