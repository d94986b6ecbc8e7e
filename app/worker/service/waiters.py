"""Requests that wait for a check to finish (`GET /v1/checks/{id}?wait=`), instead of asking
again every few milliseconds: each is woken when its job is recorded finished, or when its
time is up, and all of them at once when the server begins to shut down."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter


class Waiters:
    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self._waiting: Counter[str] = Counter()  # requests waiting now, by job
        self._closed = False

    def register(self, job_id: str) -> asyncio.Event:
        """The event `notify(job_id)` sets: take it before reading the job, so that a finish
        between the read and the wait is not missed."""
        event = self._events.setdefault(job_id, asyncio.Event())
        if self._closed:
            event.set()
        return event

    def __len__(self) -> int:
        """How many jobs have an event (kept until the job finishes, after a wait timed out too)."""
        return len(self._events)

    def waiting(self) -> int:
        """How many jobs a request waits for now."""
        return len(self._waiting)

    def notify(self, job_id: str) -> None:
        """The job is recorded finished (or there is none): wake whoever waits for it."""
        event = self._events.pop(job_id, None)
        if event is not None:
            event.set()

    def close(self) -> None:
        """Wake every waiter now, and any later one at once: a shutdown must not wait for them."""
        self._closed = True
        for event in self._events.values():
            event.set()
        self._events.clear()

    async def wait(self, job_id: str, event: asyncio.Event, seconds: float) -> None:
        self._waiting[job_id] += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), seconds)
        finally:
            self._waiting[job_id] -= 1
            if not self._waiting[job_id]:
                del self._waiting[job_id]
