"""The seam between the check service and what runs its checks.

The service queues, records and times jobs; a `CheckRunner` runs one check and reports
on the machinery that does it. The warm rank pool (app.worker.service.pool.RankPool) is the real
one; API tests use a fake that needs no torch and no processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from app.contract.check_result import CheckResult
from app.contract.host import BuiltModel, ProcessDescription
from app.contract.options import Rendezvous
from app.contract.protocol import HostInfo
from app.contract.spec import CheckSpec


@dataclass(slots=True)
class Progress:
    """How far the runner got with an order: what the service says when it stops waiting
    (a timeout while the check still waited for free ranks killed nothing)."""

    waiting_for: int = 0  # rank processes it waits for, until it holds them
    holding: bool = False  # it holds its ranks: the check runs on them


@dataclass(frozen=True, slots=True)
class CheckOrder:
    """One check to run, as the service hands it over."""

    job_id: str
    spec: CheckSpec
    timeout_s: float
    rendezvous: Rendezvous | None  # None: this host alone
    # The registered model's package.module:factory, from the service's registry (None for
    # the built-in model): the runner never resolves a name a request sent.
    model_target: str | None
    progress: Progress = field(default_factory=Progress, compare=False)
    # A long check (an lr-scaling probe) runs in its own lane and leaves a rank free for the
    # short ones (execution.is_long).
    long: bool = False


# How long a rank killed by SIGTERM/SIGINT waits before it is replaced: a signal to the
# whole process group is most likely the server's own shutdown, which follows within it.
SHUTDOWN_GRACE_S = 2.0


class RankDied(RuntimeError):
    """A rank process of the check died (or was dead when asked)."""

    def __init__(self, message: str, by_shutdown_signal: bool = False) -> None:
        super().__init__(message)
        # Killed by SIGTERM/SIGINT: most likely the whole process group is being stopped.
        self.by_shutdown_signal = by_shutdown_signal


class RankError(RuntimeError):
    """A rank reported that the check failed (its exception, as text)."""

    def __init__(
        self,
        message: str,
        traceback: str | None = None,
        model_raised: bool = False,
        group_lost: bool = False,
        ranks_kept: bool = False,
    ) -> None:
        super().__init__(message)
        self.traceback = traceback
        # The model's own code raised it: the rank left the check cleanly.
        self.model_raised = model_raised
        # The rank did not hold the process group the pool named: the check never started there.
        self.group_lost = group_lost
        # Every rank of the check left it cleanly and can run the next one (the pool decides).
        self.ranks_kept = ranks_kept

    def kept(self) -> RankError:
        """This error, said of a check whose every rank was kept: a new error, this one its cause."""
        error = RankError(str(self), self.traceback, self.model_raised, self.group_lost, ranks_kept=True)
        error.__cause__ = self
        return error


class RanksUnavailable(RuntimeError):
    """No rank process can start (each try failed): the check did not run."""


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
    def models_info(self) -> dict[str, BuiltModel]:
        """Each registered model as its factory built it, once one was built."""
        ...

    @property
    def spawn_error(self) -> str | None:
        """Why the last start of a process failed, until one is warm again."""
        ...

    @property
    def failing(self) -> str | None:
        """Set while no process can start (every try fails): why checks cannot run."""
        ...

    def start(self) -> None:
        """Begin warming up (returns at once)."""

    def begin_stop(self) -> None:
        """A shutdown has begun: start nothing new."""

    async def stop(self) -> None:
        """End everything it started, and wait until it has."""

    def warm(self) -> Sequence[RankState]:
        """The processes ready to run checks."""
        ...

    def describe(self) -> list[ProcessDescription]:
        """Each process: pid and state."""
        ...

    async def run_check(self, order: CheckOrder) -> CheckResult:
        """Run the check: rank 0's result. Raises RankDied or RankError when it could not."""
        ...
