"""What a soak runs and what it records: the seeded plan of faults, each server process's
lifetime, and the report a judge reads (tests/support/soak.py runs it)."""

from __future__ import annotations

import random
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .soak_mix import Ledger, Verdict

FAULTS = ("rank", "fork_server", "sigterm", "sigkill", "flood")


@dataclass(frozen=True)
class SoakPlan:
    seed: int
    faults: tuple[str, ...]  # in the order the chaos loop injects them
    gap_s: tuple[float, float] = (0.5, 1.5)  # checks run this long (at random) between faults
    processes: int = 2
    queue_size: int = 8
    backlog: int = 3  # queued checks the submitter keeps waiting
    recovery_limit_s: float = 120.0  # a fault not recovered from within this fails the soak

    @classmethod
    def random(cls, seed: int, count: int, **options: Any) -> SoakPlan:
        """`count` faults of every kind, in a seeded order (ranks killed three times as often)."""
        rng = random.Random(seed)
        kinds = [rng.choice((*FAULTS, "rank", "rank")) for _ in range(max(0, count - len(FAULTS)))]
        faults = [*FAULTS, *kinds]
        rng.shuffle(faults)
        return cls(seed, tuple(faults), **options)


@dataclass
class Lifetime:
    """One server process: its memory and open files once warm and before it stopped, and what
    of its session outlived it."""

    pid: int
    start: tuple[int, int] = (0, 0)  # (RSS KiB, fds)
    end: tuple[int, int] = (0, 0)
    seconds: float = 0.0
    warm_s: float = 0.0  # from its start to a warm pool
    leaked: list[str] = field(default_factory=list)


@dataclass
class Report:
    ledger: Ledger = field(default_factory=Ledger)
    verdict: Verdict = field(default_factory=Verdict)
    faults: Counter[str] = field(default_factory=Counter)
    recovery_s: dict[str, list[float]] = field(default_factory=dict)
    lifetimes: list[Lifetime] = field(default_factory=list)
    readyz_samples: Counter[str] = field(default_factory=Counter)
    readyz_lies: list[str] = field(default_factory=list)
    readyz_missed: list[str] = field(default_factory=list)  # a fork server restart it called ready
    zombies: list[str] = field(default_factory=list)
    flood_refusals: list[int] = field(default_factory=list)
    wall_s: float = 0.0

    def recoveries(self) -> list[float]:
        return [s for values in self.recovery_s.values() for s in values]

    def median_max(self) -> tuple[float, float]:
        values = self.recoveries()
        return (statistics.median(values), max(values)) if values else (0.0, 0.0)
