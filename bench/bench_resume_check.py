"""The resume check over HTTP on warm ranks: a 20-step DDP run of 4 replicas checkpointed after
7 steps and resumed on 2 (the OpenAPI example `resume`), against the same 20-step run check
without the resume, measured on the same server in the same run, rounds interleaved.

    .venv/bin/python bench/bench_resume_check.py [--runs 7] [--json out.json]

Starts `uvicorn app.main:app` with 4 warm rank processes, submits each check once not counted
(the first resume forms the 2-rank group), then `--runs` of each in turn, waiting with
`?wait=`. Prints the medians, the ratio resume / run, and PASS/MISS against the target: the
resume check answers in at most 1 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_line, verdict
from bench_checks import check_over_http, warm_worker

from app.schemas.check_examples import CHECK_EXAMPLES

TARGET_S = 1.0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    resume: dict[str, Any] = CHECK_EXAMPLES["resume"]["value"]
    run = {key: value for key, value in resume.items() if key != "resume"}
    print(machine_line())
    with tempfile.TemporaryDirectory() as tmp, warm_worker(tmp) as client:
        for body in (run, resume):
            check_over_http(client, body)  # not counted: the first of each forms its groups
        times: dict[str, list[float]] = {"run": [], "resume": []}
        result: dict[str, Any] = {}
        for _ in range(args.runs):
            for name, body in (("run", run), ("resume", resume)):
                elapsed, answer = check_over_http(client, body)
                times[name].append(elapsed)
                result = answer if name == "resume" else result
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratio = medians["resume"] / medians["run"]
    laps = result.get("timings_s", {})
    print(f"20-step run check, 4 replicas (no resume): median {medians['run']:.3f} s of {args.runs}")
    print(
        f"20-step resume check, 4 -> 2 replicas at step 7: median {medians['resume']:.3f} s of {args.runs} "
        f"(run {laps.get('run', 0):.3f} s, reference {laps.get('run_reference', 0):.3f} s of the last), "
        f"{ratio:.2f} x the run check; target <= {TARGET_S} s: {verdict(medians['resume'] <= TARGET_S)}"
    )
    if args.json:
        figures = {
            "when": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
            "median_s": {k: round(v, 4) for k, v in medians.items()},
            "times_s": times,
            "ratio": round(ratio, 3),
        }
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
