"""One job's state in this server, from its submission until it is recorded finished, and
what its run ends with; the stored submission read back typed."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.contract.check_result import CheckResult
from app.contract.codec import decode
from app.contract.jobs import JobStatus
from app.contract.model_registry import SYNTHETIC
from app.contract.options import Rendezvous
from app.contract.request import build_spec, check_request
from app.contract.spec import CheckSpec
from app.worker.service.runner import RankError
from app.worker.service.submission import Submission


def stored_submission(stored: Mapping[str, Any]) -> Submission:
    """The stored submission, typed. A job queued by a server whose spec had another form is
    planned again from its request body, as this server would have admitted it: a queued job
    outlives an upgrade."""
    try:
        submission: Submission = decode(Submission, stored)
    except (KeyError, TypeError, ValueError):
        body = stored["body"]
        meet = stored.get("rendezvous")
        spec = build_spec(check_request(body))
        rendezvous = decode(Rendezvous, meet) if meet else None
        return Submission(body, spec, float(stored["timeout_s"]), rendezvous)
    return submission


def model_target(spec: CheckSpec, models: dict[str, str]) -> str | None:
    """The factory a check's model names, from this worker's registry as it is now (the
    model may have been unregistered by a restart since the job was queued)."""
    if spec.model != SYNTHETIC and spec.model not in models:
        raise RankError(f"check model {spec.model!r} is no longer registered on this worker")
    return models.get(spec.model)


@dataclass(eq=False)
class JobState:
    """A job from its submission until it is recorded finished."""

    id: str
    submitted: float | None  # time.monotonic() at the submission; None: queued before a restart
    # What was submitted, as this server admitted it; None: queued before a restart (then read
    # from the job store, where it outlived the server that admitted it).
    submission: Submission | None = None
    task: asyncio.Task[None] | None = None  # set while it runs: queued until then
    recording: bool = False  # it ended and its record is being written

    @property
    def queued(self) -> bool:
        return self.task is None

    def stop(self) -> asyncio.Task[None] | None:
        """Cancel the running check, unless its record is already being written (that record
        is left to finish, which a failing database may hold up); the task to wait for."""
        if self.task is not None and not self.recording:
            self.task.cancel()
        return self.task


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a check ended: what is recorded."""

    status: JobStatus
    result: CheckResult | None = None
    error: str | None = None
