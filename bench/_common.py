"""Small timing and reporting helpers shared by the bench scripts (stdlib only).

Not a test helper: nothing here asserts. Scripts print figures, PASS/MISS per target,
and always exit 0.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass
class Timing:
    label: str
    samples_s: list[float]  # seconds per call, one entry per sample
    calls: int

    @property
    def median(self) -> float:
        return statistics.median(self.samples_s)

    @property
    def p90(self) -> float:
        return quantile(self.samples_s, 0.90)

    @property
    def best(self) -> float:
        return min(self.samples_s)


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile (q in [0, 1]) of a non-empty list."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def measure(
    label: str,
    fn: Callable[[], object],
    *,
    budget_s: float,
    min_samples: int = 5,
    max_samples: int = 2000,
    sample_floor_s: float = 50e-6,
) -> Timing:
    """Time fn() repeatedly for about budget_s seconds.

    Each sample times `inner` back-to-back calls (inner is chosen so that one sample lasts
    at least sample_floor_s, which keeps timer overhead out of sub-microsecond figures) and
    records the per-call mean of that sample. One warm-up call runs first.
    """
    fn()
    gc.collect()
    started = time.perf_counter()
    fn()
    first = max(time.perf_counter() - started, 1e-9)
    inner = max(1, int(sample_floor_s / first))
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    perf = time.perf_counter
    calls = 0
    while len(samples) < max_samples and (len(samples) < min_samples or perf() < deadline):
        t0 = perf()
        for _ in range(inner):
            fn()
        samples.append((perf() - t0) / inner)
        calls += inner
    return Timing(label, samples, calls)


def fmt_time(seconds: float) -> str:
    if seconds < 1e-6:
        return f"{seconds * 1e9:7.1f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:7.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:7.2f} ms"
    return f"{seconds:7.2f} s "


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    return "\n".join(out)


def machine_line() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (
        f"python {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load avg {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
