"""`batchplan check --steps N`: a run of the plan's recipe on a real server's warm ranks and
locally, its per-step table, and its chart saved with --chart (fetched from the server, or
drawn here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.cli import Invoke, on
from support.servers import Server

# 2 replicas, accumulation 2, a warmup from 0 and clipping: the run-level controls all apply.
RUN = ["--gpus-per-node", "2", "-b", "16", "-m", "4", "--base-lr", "0.1", "--rule", "none"]
RUN += ["--warmup-steps", "2", "--warmup-start-lr", "0", "--max-grad-norm", "0.5"]
ROW = re.compile(r"^ +(\d+) +(\d+) +\S+ +\S+ +\S+ +\S+$")


def _steps(stdout: str) -> list[tuple[int, int]]:
    return [(int(m.group(1)), int(m.group(2))) for line in stdout.splitlines() if (m := ROW.match(line))]


@pytest.mark.slow
def test_a_run_on_a_server_prints_its_steps_and_saves_its_chart(
    run: Invoke, worker_server: Server, tmp_path: Path
) -> None:
    chart = tmp_path / "run.png"
    out = run(
        "check",
        *RUN,
        "--steps",
        "12",
        "--chart",
        str(chart),
        *on(worker_server),
    )
    assert out.exit_code == 0, out.stderr
    assert "the run of 12 optimizer steps matches the single-process reference run" in out.stdout
    # A long run shows its first and last five steps; the default dataset has 6 steps an epoch.
    assert _steps(out.stdout) == [
        (0, 0),
        (1, 0),
        (2, 0),
        (3, 0),
        (4, 0),
        (7, 1),
        (8, 1),
        (9, 1),
        (10, 1),
        (11, 1),
    ]
    for control in ("scheduler_per_micro_batch", "scheduler_per_process", "set_epoch_missing"):
        assert re.search(rf"^  detected +{control} ", out.stdout, re.MULTILINE), out.stdout
    assert chart.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and f"wrote {chart}" in out.stderr


@pytest.mark.slow
def test_a_chart_needs_a_run(run: Invoke, worker_server: Server, tmp_path: Path) -> None:
    chart = tmp_path / "one.png"
    out = run("check", *RUN, "--chart", str(chart), *on(worker_server))
    assert out.exit_code == 2 and "the check has no run (give --steps above 1)" in out.stderr
    assert not chart.exists()


RESUME = ["--steps", "6", "--resume-at", "2", "--resume-replicas", "1"]


def _resumed(stdout: str) -> None:
    assert (
        "resumed at step 2 (epoch 0, step 2 of it): 2 -> 1 replicas, micro-batch 4 x accumulation 4" in stdout
    )
    assert "from there the run matches the uninterrupted reference" in stdout
    assert "replicas 0-0: set_epoch(0), skip 8 micro-batches (32 samples)" in stdout
    for control in ("resume_without_skip", "resume_schedule_restart", "resume_per_rank_position"):
        assert re.search(rf"^  detected +{control} ", stdout, re.MULTILINE), stdout


@pytest.mark.slow
def test_a_resume_check_on_a_server_prints_its_resume(run: Invoke, worker_server: Server) -> None:
    out = run("check", *RUN, *RESUME, *on(worker_server))
    assert out.exit_code == 0, out.stderr
    _resumed(out.stdout)
    assert _steps(out.stdout) == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 1), (5, 1)]


@pytest.mark.slow
def test_a_resume_check_here_prints_its_resume_and_draws_its_own_chart(run: Invoke, tmp_path: Path) -> None:
    """Here, the ranks this command starts: one run serves both (each local run starts its
    ranks cold), the resume it prints and the chart drawn here rather than fetched."""
    chart = tmp_path / "run.svg"
    out = run("check", *RUN, *RESUME, "--chart", str(chart))
    assert out.exit_code == 0, out.stderr
    _resumed(out.stdout)
    assert _steps(out.stdout) == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 1), (5, 1)]
    assert b"<svg" in chart.read_bytes() and b"set_epoch_missing" in chart.read_bytes()


def test_a_resume_check_needs_both_flags(run: Invoke) -> None:
    out = run("check", *RUN, "--steps", "6", "--resume-at", "2")
    assert out.exit_code == 2 and "--resume-at K --resume-replicas W2" in out.stderr


def test_a_refused_resume_names_its_field(run: Invoke) -> None:
    out = run("check", *RUN, "--steps", "6", "--resume-at", "6", "--resume-replicas", "1")
    assert out.exit_code == 2 and "--resume-at 6 is not inside the run of 6" in out.stderr
    assert "try --resume-at 5" in out.stderr
