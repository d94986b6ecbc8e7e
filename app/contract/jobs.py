"""A check job and the statuses it moves through, as plain data: the job store writes it,
the HTTP schemas serve it (`schemas.checks.job_json`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from app.core.errors.domain import Conflict
from app.core.records.record import record


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # the check ran; whether the plan held is in its result
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self not in _NEXT

    def can_become(self, other: JobStatus) -> bool:
        return other in _NEXT.get(self, ())

    def sources(self) -> tuple[JobStatus, ...]:
        """The statuses a job may reach this one from."""
        return tuple(s for s, nexts in _NEXT.items() if self in nexts)


# A queued job starts, or ends without running (cancelled, or failed when a restart finds
# the queue full); a running one ends. Nothing leaves a finished status.
_NEXT: dict[JobStatus, tuple[JobStatus, ...]] = {
    JobStatus.QUEUED: (JobStatus.RUNNING, JobStatus.FAILED, JobStatus.CANCELLED),
    JobStatus.RUNNING: (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED),
}

FINISHED = tuple(s for s in JobStatus if s.finished)


class IllegalTransition(Conflict):
    """A job asked to move where its status does not lead."""


@record
class Job:
    id: str
    status: JobStatus
    created_at: str
    # What was submitted, as stored: the request body, the check spec, timeout, rendezvous
    # (the worker's Submission). Its `body` is what the HTTP job shows as `request`.
    submission: Mapping[str, Any]
    started_at: str | None = None
    finished_at: str | None = None
    # The rank's CheckResult as the codec's JSON text (`codec.json_text`), as the store wrote it:
    # GET serves it as it is, never parsed and written again.
    result_json: str | None = None
    error: str | None = None

    @property
    def result(self) -> Mapping[str, Any] | None:
        """The result's JSON values, parsed for a reader of its parts (a chart, a plan that
        takes an lr-scaling probe's answer)."""
        if self.result_json is None:
            return None
        parsed: Mapping[str, Any] = json.loads(self.result_json)
        return parsed

    def check_transition(self, to: JobStatus) -> None:
        """Refuse a move that `status` does not allow (a conflict: the job moved on)."""
        if self.status.can_become(to):
            return
        if self.status.finished:
            raise IllegalTransition(f"check {self.id} already {self.status}")
        raise IllegalTransition(f"check {self.id} is {self.status}; it cannot become {to}")
