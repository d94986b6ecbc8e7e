"""The progress line of a running check, on stderr."""

from __future__ import annotations

import math
import sys
from types import TracebackType
from typing import Any

import typer

from app.client import Json


class Progress:
    """A spinner with the elapsed time on a terminal; otherwise a plain line when the status
    changes and every `every_s` seconds. Always on stderr, so stdout stays the result."""

    def __init__(self, label: str, every_s: float = 5.0) -> None:
        self.label = label
        self.every_s = every_s
        self.tty = sys.stderr.isatty()
        self._status: Any = None
        self._last: tuple[str | None, float] = (None, -math.inf)

    def __enter__(self) -> Progress:
        if self.tty:
            from rich.console import Console

            self._status = Console(stderr=True).status(f"{self.label}: starting")
            self._status.start()
        return self

    def __call__(self, job: Json, elapsed: float) -> None:
        status = str(job.get("status"))
        text = f"{self.label}: {status}, {elapsed:.1f} s"
        if self._status is not None:
            self._status.update(text)
            return
        last_status, last_at = self._last
        if status != last_status or elapsed - last_at >= self.every_s:
            typer.echo(text, err=True)
            self._last = (status, elapsed)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._status is not None:
            self._status.stop()
