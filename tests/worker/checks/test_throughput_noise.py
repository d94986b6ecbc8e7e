"""A throughput point whose repeats disagree: remeasured, then flagged, and said in the table and
the JSON with what to do; a step that took less time at a larger micro-batch is said too."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

from app.cli.throughput_table import curve_lines
from app.contract.codec import encode
from app.contract.kinds.throughput import SPREAD_BOUND, SPREAD_IS, Throughput, ThroughputPoint
from app.worker.checks.throughput_check import noise_warnings
from app.worker.measure.throughput import REMEASURE_ROUNDS, Timed, time_sizes

REPEATS = 4


def _timed(spread_bound: float | None) -> dict[int, Timed]:
    """Micro-batch 2's step sleeps 0 or 4 ms in turn (a busy host, made certain): its repeats
    of one step each disagree by far more than the bound, however idle the machine is."""
    module = torch.nn.Linear(2, 1)
    pauses = itertools.cycle([0.0, 0.004])

    def loss(m: torch.nn.Module, x: Any, y: Any) -> torch.Tensor:
        if len(x) == 2:
            time.sleep(next(pauses))
        return ((m(x) - y) ** 2).mean()

    def batch(b: int) -> tuple[Any, Any]:
        return torch.ones(b, 2), torch.zeros(b, 1)

    timed, _ = time_sizes(
        module,
        loss,
        batch,
        [2],
        torch.device("cpu"),
        repeats=REPEATS,
        warmup=1,
        optimizer=False,
        min_repeat_s=1e-9,  # one micro-step a repeat: each repeat sees one pause or none
        spread_bound=spread_bound,
    )
    return timed


def test_a_point_whose_repeats_disagree_is_remeasured_then_flagged() -> None:
    assert len(_timed(None)[2].times) == REPEATS
    noisy = _timed(SPREAD_BOUND)[2]
    assert len(noisy.times) == REPEATS * (1 + REMEASURE_ROUNDS)
    assert noisy.spread > SPREAD_BOUND


def _point(b: int, step: float, noisy: bool) -> ThroughputPoint:
    return ThroughputPoint(
        b, step, 0.6 if noisy else 0.01, b / step, None, None, 10, 30 if noisy else 10, noisy
    )


def test_noisy_points_and_a_faster_larger_step_warn_in_the_json_and_the_table() -> None:
    points = [_point(1, 0.010, False), _point(2, 0.012, True), _point(4, 0.008, False)]
    warnings = noise_warnings(points, 10)
    assert len(warnings) == 2
    assert "micro-batch 2 (60%)" in warnings[0] and "idle host" in warnings[0] and "repeats" in warnings[0]
    assert "micro-batch 4's step" in warnings[1] and "micro-batch 2's" in warnings[1]
    measured = Throughput(
        tuple(points), 0.05, 10, 3, False, SPREAD_IS, "cpu", 1, "rank 0", None, 0.1, SPREAD_BOUND, warnings
    )
    as_json = encode(measured)
    assert as_json["warnings"] == list(warnings) and as_json["points"][1]["noisy"] is True
    table = "\n".join(curve_lines(as_json))
    assert "NOISY over 30 repeats" in table
    assert all(f"warning: {w}" in table for w in warnings)
    # A quiet curve warns of nothing.
    assert noise_warnings([_point(1, 0.010, False), _point(2, 0.015, False)], 10) == ()
