"""The soak's figures as text: what the test prints and bench/bench_soak.py reports."""

from __future__ import annotations

from collections import Counter

from .soak_plan import Report


def render(report: Report) -> str:
    ledger, verdict = report.ledger, report.verdict
    by_status: Counter[str] = Counter()
    for key, count in verdict.outcomes.items():
        by_status[key.rsplit(" ", 1)[1]] += count
    median, worst = report.median_max()
    lines = [
        f"wall time                 {report.wall_s:.1f} s",
        f"checks accepted (202)     {len(ledger.accepted)}",
        f"  ended                   {_counts(by_status)}",
        f"  by kind                 {_counts(verdict.outcomes)}",
        f"  failure reasons         {_counts(verdict.reasons)}",
        f"refused                   {_counts(Counter({str(k): v for k, v in ledger.refused.items()}))}",
        f"cancel requests           {_counts(Counter({str(k): v for k, v in ledger.cancels.items()}))}",
        f"faults injected           {_counts(report.faults)}",
        f"429s per flood            {report.flood_refusals}",
        f"recovery to warm (s)      median {median:.2f}, max {worst:.2f}",
    ]
    for kind, values in sorted(report.recovery_s.items()):
        lines.append(f"  {kind:<23} {', '.join(f'{v:.2f}' for v in values)}")
    leaked = sum(len(life.leaked) for life in report.lifetimes)
    lines += [
        f"lost jobs                 {len(verdict.lost)}",
        f"ended without a reason    {len(verdict.without_reason)}",
        f"internal errors           {len(verdict.internal_errors)}",
        f"unlike the clean rerun    {len(verdict.differs)}",
        f"unexpected answers        {len(ledger.unexpected)}",
        f"/readyz samples           {_counts(report.readyz_samples)}",
        f"/readyz untrue            {len(report.readyz_lies) + len(report.readyz_missed)}",
        f"zombies (over 1 s)        {len(report.zombies)}",
        f"leaked processes          {leaked}",
        "server lives              RSS MiB start -> end, fds start -> end, s to warm, s alive",
    ]
    for i, life in enumerate(report.lifetimes):
        lines.append(
            f"  {i} (pid {life.pid:<7})       {life.start[0] / 1024:.1f} -> {life.end[0] / 1024:.1f}, "
            f"{life.start[1]} -> {life.end[1]}, {life.warm_s:.1f}, {life.seconds:.0f}"
        )
    problems = [*verdict.lost, *verdict.without_reason, *verdict.internal_errors, *verdict.differs]
    problems += [*ledger.unexpected, *report.readyz_lies, *report.readyz_missed, *report.zombies]
    lines += [f"  ! {problem}" for problem in problems]
    return "\n".join(lines)


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items())) or "none"
