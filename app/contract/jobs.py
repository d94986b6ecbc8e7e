"""A check job and the statuses it moves through, as plain data.

Here rather than in app.worker because the HTTP schemas (a sibling layer of the worker)
read jobs too; both may import the core.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from app.core.errors import Conflict
from app.core.records import record


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
    submission: dict[str, Any]
    started_at: str | None = None
    finished_at: str | None = None
    result: dict[str, Any] | None = None
    error: str | None = None

    def check_transition(self, to: JobStatus) -> None:
        """Refuse a move that `status` does not allow (a conflict: the job moved on)."""
        if self.status.can_become(to):
            return
        if self.status.finished:
            raise IllegalTransition(f"check {self.id} already {self.status}")
        raise IllegalTransition(f"check {self.id} is {self.status}; it cannot become {to}")

    def to_json(self) -> dict[str, Any]:
        """The job as the store reads it back: every column, plain JSON values."""
        return {
            "id": self.id,
            "status": self.status.value,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "submission": self.submission,
            "result": self.result,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        return cls(
            id=data["id"],
            status=JobStatus(data["status"]),
            created_at=data["created_at"],
            submission=data["submission"],
            started_at=data.get("started_at"),
            finished_at=data.get("finished_at"),
            result=data.get("result"),
            error=data.get("error"),
        )
