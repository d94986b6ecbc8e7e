"""What a check job holds from its submission to its end, as the job store keeps it (through
the codec): the request as its client sent it (as the schema validated it), the spec every
rank runs, the timeout and the rendezvous. Written once when the job is created, read when it
runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.contract.options import Rendezvous
from app.contract.spec import CheckSpec


@dataclass(frozen=True, slots=True)
class Submission:
    body: Mapping[str, Any]  # what GET /v1/checks/{id} shows as `request`: JSON as sent
    spec: CheckSpec
    timeout_s: float
    rendezvous: Rendezvous | None = None
