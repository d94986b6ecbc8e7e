"""The progress line of a running check, on stderr: the phase it is in and the time so far.

The phases are what the CLI can see. On a server (--url): the job's status and the worker's
rank counts from GET /v1/host (warming ranks, queued, running). Here: the launcher's steps
(planning, starting ranks, running, then comparing on rank 0 once the other ranks are done).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import typer

from app.client import Json


class Progress:
    """A spinner with the phase and elapsed time on a terminal; otherwise a plain line when the
    phase changes and every `every_s` seconds. Always on stderr, so stdout stays the result."""

    def __init__(self, label: str, every_s: float = 5.0) -> None:
        self.label = label  # the commands name the check once they know it
        self.every_s = every_s
        self.tty = sys.stderr.isatty()
        self._status: Any = None
        self._started = time.monotonic()
        self._last: tuple[str | None, float] = (None, -math.inf)

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        if self.tty:
            from rich.console import Console

            self._status = Console(stderr=True).status(f"{self.label}: starting")
            self._status.start()
        return self

    def show(self, phase: str, *, logged: bool = True) -> None:
        """Show `phase`. `logged=False`: on a terminal only, so that what a step before the
        check's own phases prints (an error while planning) comes first in a log."""
        elapsed = time.monotonic() - self._started
        text = f"{self.label}: {phase}, {elapsed:.1f} s"
        if self._status is not None:
            self._status.update(text)
            return
        last_phase, last_at = self._last
        if logged and (phase != last_phase or elapsed - last_at >= self.every_s):
            typer.echo(text, err=True)
            self._last = (phase, elapsed)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._status is not None:
            self._status.stop()


class ServerPhase:
    """A check's phase on a server, from its job and the worker's ranks (`host()`, None when
    GET /v1/host cannot be read). A running job with no busy rank is still waiting for ranks;
    the server does not say when rank 0 compares, so its last phase is "running"."""

    def __init__(self, host: Callable[[], Json | None]) -> None:
        self.host = host
        self._ranks_busy = False  # once seen, the ranks are running the check: no more asking

    def __call__(self, job: Json) -> str:
        status = str(job.get("status"))
        if status not in ("queued", "running") or self._ranks_busy:
            return status
        host = self.host()
        if host is None:
            return status
        warm, size, busy = (host.get(k) for k in ("warm_processes", "processes_per_host", "busy_processes"))
        if status == "running" and isinstance(busy, int) and busy > 0:
            self._ranks_busy = True
            return "running"
        if isinstance(warm, int) and isinstance(size, int) and warm < size:
            return f"warming ranks ({warm}/{size} warm)"
        return "queued" if status == "queued" else "waiting for free ranks"


def local_phase(codes: list[int | None]) -> str:
    """A local check's phase from its rank processes' exit codes (None: still running).
    Ranks other than 0 exit after the DDP step and the controls; rank 0 then compares."""
    others_done = len(codes) > 1 and all(c == 0 for c in codes[1:])
    return "comparing on rank 0" if codes[0] is None and others_done else "running"
