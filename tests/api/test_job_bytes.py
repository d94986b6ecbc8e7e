"""A check job's answer: its stored result is spliced in as the job store holds it, and the bytes
are those of the whole job written at once (what the server answered when it parsed the result
and wrote it again)."""

from __future__ import annotations

import json

from support.fake_runner import passing_result

from app.api.checks import _job_text
from app.contract.codec import encode, json_text
from app.contract.jobs import Job, JobStatus
from app.contract.request import build_spec, check_request
from app.worker.service.runner import CheckOrder

BODY = {
    "plan": {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 8},
    "note": "16 × 2 → ok",
}


def test_a_finished_job_is_answered_as_if_its_result_were_written_with_it() -> None:
    result = passing_result(
        CheckOrder("a", build_spec(check_request({"plan": BODY["plan"]})), 60, None, None)
    )
    stored = json_text(encode(result))
    job = Job("a", JobStatus.SUCCEEDED, "2026-01-01T00:00:00Z", {"body": BODY}, "t1", "t2", stored, None)
    whole = json.dumps(
        {
            "id": "a",
            "status": "succeeded",
            "created_at": "2026-01-01T00:00:00Z",
            "started_at": "t1",
            "finished_at": "t2",
            "result": json.loads(stored),
            "error": None,
            "request": BODY,
        },
        ensure_ascii=False,
        allow_nan=False,
        separators=(",", ":"),
    )
    assert _job_text(job) == whole
    queued = Job("b", JobStatus.QUEUED, "2026-01-01T00:00:00Z", {"body": BODY})
    assert json.loads(_job_text(queued))["result"] is None and "× 2 →" in _job_text(queued)
