"""`batchplan measure`: a check's throughput curve on a real server's warm ranks and locally, its
table (a row per micro-batch, the fastest and the knee marked, the curve as a plan takes it) and
its chart saved with --chart (fetched from the server, or drawn here); a bad size list is refused
at its field before any rank starts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.cli import Invoke, on
from support.servers import Server

PLAN = ["--gpus-per-node", "2", "-b", "16", "--max-micro-batch-size", "16"]
MEASURE = ["--micro-batch-sizes", "1,2,4,8,16", "--repeats", "3", "--measure-warmup-steps", "1"]
ROW = re.compile(r"^ +(\d+) +\S+ s +[\d.]+% +\S+ +\S+ +\S+(  <- (.+))?$")


def _rows(stdout: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(3) or "" for line in stdout.splitlines() if (m := ROW.match(line))}


def _curve(stdout: str) -> list[dict[str, float]]:
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("as topology.throughput_curve"))
    curve: list[dict[str, float]] = json.loads(lines[at + 1])
    return curve


def _table_holds(stdout: str) -> None:
    rows = _rows(stdout)
    assert list(rows) == [1, 2, 4, 8, 16], stdout
    assert sum("fastest" in mark for mark in rows.values()) == 1
    assert sum("knee" in mark for mark in rows.values()) == 1
    assert [p["micro_batch_size"] for p in _curve(stdout)] == [1, 2, 4, 8, 16]
    assert "the check of the plan passed" in stdout


@pytest.mark.slow
def test_measure_on_a_server_prints_the_table_and_saves_the_chart(
    run: Invoke, worker_server: Server, tmp_path: Path
) -> None:
    chart = tmp_path / "curve.png"
    out = run("measure", *PLAN, *MEASURE, "--chart", str(chart), *on(worker_server))
    assert out.exit_code == 0, out.stderr
    _table_holds(out.stdout)
    assert "cold" not in out.stdout  # the server's ranks are warm
    assert chart.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and f"wrote {chart}" in out.stderr
    # The curve it printed plans as it is.
    flag = ",".join(f"{p['micro_batch_size']}:{p['samples_per_s']}" for p in _curve(out.stdout))
    planned = run("plan", *PLAN, "--throughput-curve", flag, "--url", worker_server.url, "--json")
    assert planned.exit_code == 0, planned.stderr
    assert json.loads(planned.stdout)["throughput"]["predicted_step_s"] > 0


@pytest.mark.slow
def test_measure_here_draws_its_own_chart(run: Invoke, tmp_path: Path) -> None:
    chart = tmp_path / "curve.svg"
    out = run("measure", *PLAN, *MEASURE, "--chart", str(chart))
    assert out.exit_code == 0, out.stderr
    _table_holds(out.stdout)
    # Ranks this command started are cold: the table says so, with what to do.
    assert "warning: measured on ranks this command started (cold" in out.stdout
    assert "--url" in out.stdout
    assert b"<svg" in chart.read_bytes() and b"knee" in chart.read_bytes()


def test_sizes_past_the_cap_are_refused_at_their_field(run: Invoke) -> None:
    out = run("measure", *PLAN, "--micro-batch-sizes", "8,32")
    assert out.exit_code == 2
    assert "micro-batch 32 is past the plan's cap of 16" in out.stderr, out.stderr
    out = run("measure", *PLAN, "--micro-batch-sizes", "4,x")
    assert out.exit_code == 2 and "give whole numbers" in out.stderr
