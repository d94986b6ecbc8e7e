"""Where a check's time went on rank 0: a lap per phase, the rank's total, (set by the caller
that formed the process group) how long forming the group took and (set by the service) how
long the check ran, waited and took in all."""

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
    # Set by the service that ran the check: the check's whole run, its wait in the queue,
    # and both (None under torchrun, where no service runs it).
    check: float | None = None
    queued: float | None = None
    end_to_end: float | None = None

    def with_laps(self, laps: Mapping[str, float]) -> Timings:
        """These timings and phases that ran after them on the same rank (a run's)."""
        return dataclasses.replace(
            self, laps={**self.laps, **laps}, rank_total=round(self.rank_total + sum(laps.values()), 6)
        )

    def with_setup(self, seconds: float) -> Timings:
        return dataclasses.replace(self, init_process_group=round(seconds, 6))

    def with_service(self, check: float, queued: float | None, end_to_end: float | None) -> Timings:
        return dataclasses.replace(
            self, check=_rounded(check), queued=_rounded(queued), end_to_end=_rounded(end_to_end)
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.laps, "rank_total": self.rank_total}
        for name in _OPTIONAL:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, float]) -> Timings:
        laps = {k: v for k, v in data.items() if k != "rank_total" and k not in _OPTIONAL}
        return cls(laps, data["rank_total"], **{k: data.get(k) for k in _OPTIONAL})


_OPTIONAL = ("init_process_group", "check", "queued", "end_to_end")


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 6)


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
