"""Soak benchmark: the long run of tests/reliability/test_soak.py, by hand.

Starts a real uvicorn server (worker on, `--processes` warm ranks, its own port, folder and
job database) and runs a seeded mix of checks (DDP, accumulation, uneven, tokens, a pipeline
mesh, a registered model, a model that raises, cancellations) while a chaos loop injects
`--faults` faults, every kind at least once, in a seeded order: SIGKILL of a rank, SIGKILL of
the fork server, SIGTERM and SIGKILL of the server (each restarted on the same database), and
a flood of the queue past its limit. Between faults the checks run for `--gap` seconds.

It prints checks run and how they ended, faults by kind, the time back to a warm pool after
each (median, max), lost jobs, results unlike a clean rerun, /readyz answers that were not
true, zombies, leaked processes, and the server's RSS and open files at the start and end of
each of its lives; then PASS/MISS for each property the CI soak asserts.

    .venv/bin/python bench/bench_soak.py                      # 40 faults, ~6 min
    .venv/bin/python bench/bench_soak.py --faults 10 --gap 1 2  # ~2 min

Bounded in time; always exits 0; every server's whole session is ended on every exit path.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, machine_line, verdict

sys.path.insert(0, str(ROOT / "tests"))  # support's own modules import as `support.*` there

from support.soak import Report, Soak, SoakPlan
from support.soak_report import render

RECOVERY_TARGET_S = 90.0  # the CI soak's limit: a new fork server imports torch first
GROWTH_TARGET_KIB = 16 * 1024  # RSS a server may gain over a life once warm
FDS_TARGET = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=40)
    parser.add_argument("--gap", type=float, nargs=2, default=(2.0, 6.0), metavar=("MIN_S", "MAX_S"))
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--queue-size", type=int, default=8)
    args = parser.parse_args()
    plan = SoakPlan.random(
        args.seed,
        args.faults,
        gap_s=tuple(args.gap),
        processes=args.processes,
        queue_size=args.queue_size,
        recovery_limit_s=3 * RECOVERY_TARGET_S,
    )
    print(machine_line())
    print(
        f"soak: seed {args.seed}, {len(plan.faults)} faults, {args.processes} ranks, queue {args.queue_size}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as folder:
        try:
            report = Soak(plan, Path(folder)).run()
        except AssertionError as err:  # a fault the pool did not recover from in time
            print(f"MISS  the soak stopped: {err}")
            return
    print(render(report))
    print()
    for line in verdicts(report):
        print(line)


def verdicts(report: Report) -> list[str]:
    v, ledger = report.verdict, report.ledger
    median, worst = report.median_max()
    first_warm = report.lifetimes[0].warm_s if report.lifetimes else float("nan")
    growth = max((life.end[0] - life.start[0] for life in report.lifetimes), default=0)
    fds = max((life.end[1] - life.start[1] for life in report.lifetimes), default=0)
    leaked = sum(len(life.leaked) for life in report.lifetimes)
    rows = [
        ("lost jobs", len(v.lost), 0),
        (
            "jobs ended without a reason or with an internal error",
            len(v.without_reason) + len(v.internal_errors),
            0,
        ),
        ("succeeded results unlike the clean rerun", len(v.differs), 0),
        ("unexpected answers", len(ledger.unexpected), 0),
        ("max seconds back to a warm pool", round(worst, 2), RECOVERY_TARGET_S),
        ("/readyz answers that were not true", len(report.readyz_lies) + len(report.readyz_missed), 0),
        ("zombies over 1 s", len(report.zombies), 0),
        ("leaked processes", leaked, 0),
        ("RSS KiB gained over a server's life", growth, GROWTH_TARGET_KIB),
        ("fds gained over a server's life", fds, FDS_TARGET),
    ]
    lines = [
        f"baseline: the first server warmed up in {first_warm:.2f} s; recovery median "
        f"{median / first_warm:.2f}x, max {worst / first_warm:.2f}x of that"
    ]
    lines += [
        f"{verdict(value <= target)}  {name}: {value} (target <= {target:g})" for name, value, target in rows
    ]
    return lines


if __name__ == "__main__":
    main()
