"""The seam between the check service and what runs its checks.

The service queues, records and times jobs; a `CheckRunner` runs one check and reports
on the machinery that does it. The warm rank pool (app.worker.pool.RankPool) is the real
one; API tests use a fake that needs no torch and no processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.worker.protocol import HostInfo
from app.worker.spec import CheckSpec


@dataclass(frozen=True, slots=True)
class CheckOrder:
    """One check to run, as the service hands it over."""

    job_id: str
    spec: CheckSpec
    spec_json: str  # the spec as stored with the job: what the ranks receive
    timeout_s: float
    rendezvous: dict[str, Any] | None  # endpoint, nnodes, run_id; None: this host alone
    # The registered model's package.module:factory, from the service's registry (None for
    # the built-in model): the runner never resolves a name a request sent.
    model_target: str | None


class RankState(Protocol):
    @property
    def busy(self) -> bool: ...


class CheckRunner(Protocol):
    @property
    def size(self) -> int:
        """The processes it runs; a check takes min(replicas, size) of them."""
        ...

    @property
    def host_info(self) -> HostInfo:
        """What the host reports (empty until the runner is warm)."""
        ...

    @property
    def models_info(self) -> dict[str, dict[str, Any]]:
        """Each registered model as its factory built it, once one was built."""
        ...

    @property
    def spawn_error(self) -> str | None: ...

    def start(self) -> None:
        """Begin warming up (returns at once)."""

    def begin_stop(self) -> None:
        """A shutdown has begun: start nothing new."""

    async def stop(self) -> None:
        """End everything it started, and wait until it has."""

    def warm(self) -> Sequence[RankState]:
        """The processes ready to run checks."""
        ...

    def describe(self) -> list[dict[str, Any]]:
        """Each process: pid and state."""
        ...

    async def run_check(self, order: CheckOrder) -> dict[str, Any]:
        """Run the check; its result as JSON. Raises RankDied or RankError when it could not."""
        ...
