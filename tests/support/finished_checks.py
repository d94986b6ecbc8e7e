"""Writes app/schemas/finished_checks.py: the answers of GET /v1/checks/{id} that Swagger shows,
taken from real checks (the POST /v1/checks examples of the resume, throughput and lr-scaling
kinds, run on warm ranks here), so that a newcomer sees a finished check's every field as the
server writes it rather than the schema's placeholders.

    .venv/bin/python -m tests.support.finished_checks

Curves are thinned to a few points each (marked so in the example's description), ids and
times made stable; the rest is the server's answer. tests/api/test_finished_check_examples.py
holds the written module to the response model."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

TARGET = ROOT / "app" / "schemas" / "finished_checks.py"
KINDS = {"resume": "resume", "throughput": "throughput", "lr_scaling": "lr_scaling"}
KEEP_POINTS = 5
IDS = {
    "resume": "7d3e9a1c5b2f4e8a9c0d6b1e3f5a7c2d",
    "throughput": "2b8f4d6a0c1e3a5b7d9f1c3e5a7b9d0f",
    "lr_scaling": "9e1c3a5b7d0f2e4c6a8b0d2f4e6a8c1b",
}


def _thin(value: Any) -> Any:
    """Long lists of numbers or points cut to their first and last few (an example, not data)."""
    if isinstance(value, dict):
        return {key: _thin(item) for key, item in value.items()}
    if isinstance(value, list):
        items = [_thin(item) for item in value]
        if len(items) > 2 * KEEP_POINTS and all(not isinstance(i, str) for i in items):
            return items[:KEEP_POINTS] + items[-KEEP_POINTS:]
        return items
    return value


def _stable(job: dict[str, Any], name: str) -> dict[str, Any]:
    job = dict(job)
    job["id"] = IDS[name]
    job["created_at"] = "2026-12-06T12:00:00.000000+00:00"
    job["started_at"] = "2026-12-06T12:00:00.050000+00:00"
    job["finished_at"] = "2026-12-06T12:00:02.000000+00:00"
    return _thin(job)


def capture() -> dict[str, dict[str, Any]]:
    from app.schemas.check_examples import CHECK_EXAMPLES
    from support.apps import warm_app
    from support.polling import run_check

    found: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as folder, warm_app(Path(folder) / "jobs.sqlite3", 2) as client:
        for name in KINDS:
            body = CHECK_EXAMPLES[name]["value"]
            job = run_check(client, body, timeout=600)  # type: ignore[arg-type]
            assert job["status"] == "succeeded" and job["result"][KINDS[name]] is not None, job
            found[name] = {
                "summary": f"A finished check: {CHECK_EXAMPLES[name]['summary']}",
                "description": "The answer of a real check of the POST /v1/checks example of the same "
                "name, run on two warm CPU ranks; long curves cut to their first and last points.",
                "value": _stable(job, name),
            }
    return found


def render(found: dict[str, dict[str, Any]]) -> str:
    text = json.dumps(found, indent=1)
    return (
        '"""The answers of GET /v1/checks/{id} that Swagger shows: real finished checks, written by\n'
        "`python -m tests.support.finished_checks` (do not edit by hand).\n\n"
        "Over 300 lines: data, three servers' answers whole.\n"
        '"""\n\n'
        "# ruff: noqa: E501  (the server's sentences, as it wrote them)\n\n"
        "from __future__ import annotations\n\n"
        "import json\n"
        "from typing import Any\n\n"
        f'FINISHED_CHECKS: dict[str, dict[str, Any]] = json.loads(\n    r"""{text}"""\n)\n'
    )


def write() -> None:
    TARGET.write_text(render(capture()))
    print(f"wrote {TARGET.relative_to(ROOT)}")


if __name__ == "__main__":
    write()
