"""What a check job holds from its submission to its end, as the job store keeps it: the
request as its client sent it (as the schema validated it), the spec every rank runs, the
timeout and the rendezvous. Written once when the job is created, read when it runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from app.contract.options import Rendezvous
from app.contract.spec import CheckSpec


@dataclass(frozen=True, slots=True)
class Submission:
    body: dict[str, Any]  # what GET /v1/checks/{id} shows as `request`
    spec: CheckSpec
    timeout_s: float
    rendezvous: Rendezvous | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "body": self.body,
            "spec": self.spec.to_json(),
            "timeout_s": self.timeout_s,
            "rendezvous": self.rendezvous.to_json() if self.rendezvous else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Submission:
        rendezvous, spec = data.get("rendezvous"), data["spec"]
        return cls(
            body=data["body"],
            # A job queued before the spec was stored as an object holds it as a JSON string.
            spec=CheckSpec.from_json(json.loads(spec) if isinstance(spec, str) else spec),
            timeout_s=float(data["timeout_s"]),
            rendezvous=Rendezvous.from_json(rendezvous) if rendezvous else None,
        )
