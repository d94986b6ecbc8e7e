"""The python export under torchrun's elastic agent, a node lost mid-run (issue 37).

Two torchrun agents of one gloo process each meet in a c10d rendezvous on localhost
(--nnodes 1:2); once the run has taken 4 of its 12 optimizer steps the second agent and its
worker are SIGKILLed (a node lost; the first agent holds the rendezvous store). The first
agent restarts its worker on half the world, which resumes from the skeleton's checkpoint
with the micro-batch and accumulation that keep the global batch, and finishes. Each round
prints the seconds to the loss, from the loss to the end, the whole run, and how far the final
parameters are from the uninterrupted single-process run (float64; the run tolerance 1e-12).
The toy's micro-batches are slowed by 0.15 s so that the loss lands mid-run
(tests/support/elastic_run.py, which tests/core/test_python_resume.py also runs).

    .venv/bin/python bench/bench_elastic.py [--rounds 3]

Target: a round within 60 s on this 2-core machine. Always exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.elastic_run import RUN_TOLERANCE, elastic_run, reference_params, relative

TARGET_S = 60.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    totals = []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            run = elastic_run(Path(tmp))
        if run["code"] != 0 or run["params"] is None:
            print(f"round {i + 1}: the run failed (exit {run['code']}):\n{run['log'][-3000:]}")
            continue
        off = relative(run["params"], reference_params(run["plan"]))
        totals.append(run["seconds"])
        print(
            f"round {i + 1}: node lost at {run['killed_at']:.1f} s, run ended at {run['seconds']:.1f} s "
            f"({run['seconds'] - run['killed_at']:.1f} s to restart on half the world and finish); "
            f"final params {off:.2e} from the single-process run "
            f"({'within' if off < RUN_TOLERANCE else 'OUTSIDE'} {RUN_TOLERANCE:g})"
        )
    if totals:
        median = statistics.median(totals)
        verdict = "PASS" if median <= TARGET_S else "MISS"
        spread = f"min {min(totals):.1f}, max {max(totals):.1f}"
        print(f"median round {median:.1f} s ({spread}); target {TARGET_S:.0f} s: {verdict}")


if __name__ == "__main__":
    main()
