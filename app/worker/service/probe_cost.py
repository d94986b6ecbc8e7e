"""What an lr-scaling probe costs on this worker: seconds per sample of its work, measured from
the probes it finished, and the estimate admission holds against a check's timeout.

A probe's work is its runs (the base run and one per rule, each once per seed) spread over its
ranks: the ranks that train the most train about `samples` x ceil(runs / ranks) samples. The cost of one such
sample is each finished probe's own training lap (`timings_s.lr_scaling`, rank 0's) over its
work; the lowest of the recent ones is kept, so that a refusal says what could not finish even
at the best speed seen here. Until a probe long enough to measure has finished, the cost is
DEFAULT_S_PER_SAMPLE, measured on the default worker (4 CPU ranks, gloo, the built-in model)
on a loaded 2-core host: a probe of about 7 M samples (4 runs on 2 ranks) took its 120 s.
"""

from __future__ import annotations

import math
from collections import deque

from app.contract.kinds.lr_scaling import LrScalingSpec

DEFAULT_S_PER_SAMPLE = 8.5e-6
# A probe's lap shorter than this is mostly its fixed cost (the held-out losses, the noise
# scale), not its samples': it says nothing of the cost per sample.
MEASURABLE_LAP_S = 2.0
_KEPT = 8  # the recent measurements the cost is the lowest of


def work(probe: LrScalingSpec, ranks: int) -> int:
    """The samples the busiest rank trains: `samples` for each run it gets (every run once per
    seed)."""
    runs = (1 + len(probe.runs)) * probe.seeds
    return probe.samples * math.ceil(runs / max(1, min(ranks, runs)))


class ProbeCost:
    def __init__(self) -> None:
        self._measured: deque[float] = deque(maxlen=_KEPT)

    def per_sample_s(self) -> tuple[float, bool]:
        """Seconds per sample of a probe's work here, and whether it was measured here."""
        if self._measured:
            return min(self._measured), True
        return DEFAULT_S_PER_SAMPLE, False

    def observe(self, probe: LrScalingSpec, ranks: int, lap_s: float | None) -> None:
        """A finished probe's training lap, run on `ranks` ranks."""
        if lap_s is not None and lap_s >= MEASURABLE_LAP_S:
            self._measured.append(lap_s / work(probe, ranks))
