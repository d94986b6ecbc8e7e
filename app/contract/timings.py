"""Where a check's time went on rank 0, as the result's `timings_s` shows it: a lap per phase in
the order the phases ran, the rank's total (`rank_total`), then, where set, how long forming
the process group took (`init_process_group`, by the caller that formed it) and how long the
check ran, waited and took in all (`check`, `queued`, `end_to_end`, by the service). A plain
mapping of names to seconds: it is the JSON itself."""

from __future__ import annotations

import time
from collections.abc import Mapping

Timings = dict[str, float]

RANK_TOTAL = "rank_total"
_AFTER_LAPS = (RANK_TOTAL, "init_process_group", "check", "queued", "end_to_end")


def _laps(timings: Mapping[str, float]) -> dict[str, float]:
    return {k: v for k, v in timings.items() if k not in _AFTER_LAPS}


def _ordered(laps: Mapping[str, float], rest: Mapping[str, float | None]) -> Timings:
    out = dict(laps)
    for name in _AFTER_LAPS:
        value = rest.get(name)
        if value is not None:
            out[name] = round(value, 6)
    return out


def with_setup(timings: Mapping[str, float], seconds: float) -> Timings:
    return _ordered(_laps(timings), {**timings, "init_process_group": seconds})


def with_service(
    timings: Mapping[str, float], check: float, queued: float | None, end_to_end: float | None
) -> Timings:
    return _ordered(_laps(timings), {**timings, "check": check, "queued": queued, "end_to_end": end_to_end})


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
        return {**self.laps, RANK_TOTAL: self.total()}
