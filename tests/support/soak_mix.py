"""What the soak submits (a seeded mix of check kinds) and how it judges what came back:
every 202 has a job that ended with a reason, and every succeeded result is the result a
clean rerun of the same request gives."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from app.schemas.check_examples import CHECK_EXAMPLES

EVEN_2 = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}
# A check that waits for free ranks while the pool recovers must not time out then.
TIMEOUT_S = 60

# Registered beside the example mlp: a model whose forward only takes batches of 2, so its
# checks fail with the model's own exception (and keep their ranks).
MODELS = "mlp=app.worker.example_models:mlp,raises=app.worker.example_architectures:fixed_batch"

# Each kind with its weight in the mix. The examples are the documented requests (4 replicas
# on the pool's 2 ranks, accumulation; uneven micro-batches; tokens; a 2-stage pipeline mesh).
KINDS: dict[str, tuple[dict[str, Any], int]] = {
    "ddp": ({"plan": EVEN_2}, 3),
    "accumulation": (CHECK_EXAMPLES["even"]["value"], 2),
    "uneven": ({"plan": CHECK_EXAMPLES["mixed"]["value"]["plan"]}, 2),
    "tokens": (CHECK_EXAMPLES["tokens"]["value"], 2),
    "mesh": (CHECK_EXAMPLES["mesh"]["value"], 1),
    "registered": ({"plan": EVEN_2, "model": "mlp", "noise_scale": {"steps": 4}}, 2),
    "raises": ({"plan": EVEN_2, "model": "raises"}, 1),
}

# The result fields that are measurements of time, not of the check: left out of the rerun
# comparison. Every other field, gradients and controls included, must be equal.
TIMING_FIELDS = ("timings_s",)
FINISHED = ("succeeded", "failed", "cancelled")


def body(kind: str) -> dict[str, Any]:
    return {**KINDS[kind][0], "timeout_s": TIMEOUT_S}


def pick(rng: random.Random) -> str:
    names = list(KINDS)
    return rng.choices(names, weights=[KINDS[n][1] for n in names])[0]


def deterministic(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in TIMING_FIELDS}


@dataclass
class Ledger:
    """Every submission and what it got: the 202s by job id (with their kind), the refusals."""

    accepted: dict[str, str] = field(default_factory=dict)
    refused: Counter[int] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)  # a status no submission may get
    cancels: Counter[int] = field(default_factory=Counter)

    def answered(self, kind: str, status: int, payload: Any) -> None:
        if status == 202:
            self.accepted[payload["id"]] = kind
        elif status in (429, 503):
            self.refused[status] += 1
        else:
            self.unexpected.append(f"POST {kind}: {status} {str(payload)[:300]}")


@dataclass
class Verdict:
    """The properties the soak holds, as counts and the cases that break them."""

    outcomes: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)  # 202s with no job, or a job never finished
    without_reason: list[str] = field(default_factory=list)
    internal_errors: list[str] = field(default_factory=list)
    differs: list[str] = field(default_factory=list)  # succeeded, unlike the clean rerun
    reasons: Counter[str] = field(default_factory=Counter)


def reason_kind(error: str) -> str:
    """A failure's reason, grouped for the figures."""
    for mark, name in (
        ("the model raised", "the model raised"),
        ("the model's frames", "the model raised (ranks replaced)"),
        ("died with its fork server", "rank died with the fork server"),
        ("rank process", "rank killed"),
        ("server shutting down", "server shutting down"),
        ("server stopped while", "server killed"),
        ("queue was full when the server restarted", "queue full at restart"),
        ("cancelled", "cancelled"),
        ("were not free within", "no free ranks in time"),
        ("did not finish within", "timed out"),
    ):
        if mark in error:
            return name
    return error.split("\n", 1)[0][:80]


def judge(jobs: dict[str, dict[str, Any] | None], ledger: Ledger, reruns: dict[str, Any]) -> Verdict:
    """`jobs`: every accepted id's job as the last server serves it (None: 404)."""
    verdict = Verdict()
    for job_id, kind in ledger.accepted.items():
        job = jobs.get(job_id)
        if job is None or job["status"] not in FINISHED:
            verdict.lost.append(f"{job_id} ({kind}): {job and job['status']}")
            continue
        verdict.outcomes[f"{kind} {job['status']}"] += 1
        if job["status"] == "succeeded":
            if job["result"] is None:
                verdict.without_reason.append(f"{job_id}: succeeded without a result")
            elif kind not in reruns or deterministic(job["result"]) != deterministic(reruns[kind]):
                verdict.differs.append(f"{job_id} ({kind})")
            continue
        error = job["error"] or ""
        if not error.strip():
            verdict.without_reason.append(f"{job_id} ({kind}): {job['status']} without an error")
        if "internal error" in error:
            verdict.internal_errors.append(f"{job_id} ({kind}): {error[:300]}")
        verdict.reasons[reason_kind(error)] += 1
    return verdict
