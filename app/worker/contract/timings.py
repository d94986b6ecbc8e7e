"""Where a check's time went on rank 0: a lap per phase, the rank's total, and (set by the
caller that formed the process group) how long forming the group took."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Timings:
    laps: Mapping[str, float]  # phase name to seconds, in the order the phases ran
    rank_total: float
    init_process_group: float | None = None

    def with_setup(self, seconds: float) -> Timings:
        return dataclasses.replace(self, init_process_group=round(seconds, 6))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.laps, "rank_total": self.rank_total}
        if self.init_process_group is not None:
            out["init_process_group"] = self.init_process_group
        return out


class Timer:
    def __init__(self) -> None:
        self.started = self.last = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self.last, 6)
        self.last = now

    def total(self) -> float:
        return round(time.perf_counter() - self.started, 6)

    def timings(self) -> Timings:
        return Timings(laps=dict(self.laps), rank_total=self.total())
