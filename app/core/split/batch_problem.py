"""A batch split to solve (global = micro x accumulation x data-parallel size) and its
solution, for the even split (batch.py) and the proportional one (batch_proportional.py)."""

from __future__ import annotations

from app.core.cluster.topology import ReplicaLayout
from app.core.records.plan_request import Divisibility
from app.core.records.record import record
from app.core.split.shares import Share


@record
class BatchProblem:
    layout: ReplicaLayout
    global_batch_size: int | None
    micro_batch_size: int | None
    gradient_accumulation_steps: int | None
    divisibility: Divisibility
    proportional: bool

    @property
    def strict(self) -> bool:
        return self.divisibility in (Divisibility.EXACT, Divisibility.BALANCE)


@record
class BatchSolution:
    global_batch_size: int
    gradient_accumulation_steps: int
    shares: tuple[Share, ...]
    warnings: tuple[str, ...]

    @property
    def even(self) -> bool:
        return len({s.samples for s in self.shares}) == 1


class NoFit(Exception):
    """The problem has no solution; batch.solve builds the user-facing error."""

    def __init__(self, detail: str, pointer: str) -> None:
        super().__init__(detail)
        self.detail, self.pointer = detail, pointer


def moved_warning(old: int, new: int, policy: Divisibility, why: str) -> tuple[str, ...]:
    if old == new:
        return ()
    return (f"global batch moved from {old} to {new} ({policy.value}): {why}",)
