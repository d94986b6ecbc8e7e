"""The lr-scaling probe at small batches against another revision, side by side.

    .venv/bin/python bench/bench_lr_probe_speed.py --base /tmp/base [--rounds 3] [--runs 3]

The probe of none, sqrt and linear over 65,536 samples at global 16 on 2 replicas with base 8
(8,192 base steps, 4,096 a rule: profile_checks.py's case `lr_probe16`), on warm gloo ranks
with no HTTP, in turns under `--base` (a worktree of the revision: `git worktree add /tmp/base
9c82496`) and this tree, each turn a fresh process tree. Prints each tree's median rank time and
CPU time over its ranks, and whether the answers agree: every verdict field equal (holds, best
rule, plan rule, regime) and every curve point within 1e-12 relative. Target: this tree's
median <= 2 s on a quiet 2-core machine. Then docs/lr-scaling.md's example probe at its default 3
seeds over its whole run (this tree only: "still answers in a few seconds"). Always exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_checks import HERE, _one_tree, run_case

CASE = "lr_probe16"
TOLERANCE = 1e-12


def _curves(probe: dict[str, Any]) -> dict[str, list[float | None]]:
    out = {"base": [p["loss"] for p in probe["base"]["curve"]]}
    for rule in probe["rules"]:
        out[rule["rule"]] = [p["loss"] for p in rule["curve"]]
    return out


def _worst(base: dict[str, Any], this: dict[str, Any]) -> float:
    """The largest relative difference between the two answers' curve points (inf: one diverged
    where the other did not)."""
    worst = 0.0
    old, new = _curves(base), _curves(this)
    for name, points in old.items():
        for a, b in zip(points, new[name], strict=True):
            if a is None or b is None:
                worst = worst if a is b else float("inf")
                continue
            worst = max(worst, abs(a - b) / max(abs(a), 1e-300))
    return worst


def _verdicts(probe: dict[str, Any]) -> dict[str, Any]:
    """What the probe answers. The regime is left out: issue 47 reads it halfway through the
    base run where 9c82496 read it at the start, by design."""
    return {
        "best_rule": probe["best_rule"],
        "plan_rule_holds": probe["plan_rule_holds"],
        "holds": {r["rule"]: r["holds"] for r in probe["rules"]},
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    trees = {"base": args.base.resolve(), "this": HERE.parent}
    times: dict[str, list[float]] = {"base": [], "this": []}
    cpu: dict[str, list[float]] = {"base": [], "this": []}
    answers: dict[str, dict[str, Any]] = {}
    print(f"load before: {os.getloadavg()}")
    for turn in range(args.rounds):
        order = list(trees.items()) if turn % 2 == 0 else list(trees.items())[::-1]
        for label, tree in order:
            answer = _one_tree(tree, CASE, args.runs)
            times[label] += answer["times"]
            cpu[label] += answer["cpu"]
            answers[label] = answer["result"]["lr_scaling"]
    print(f"load after: {os.getloadavg()}")
    for label in trees:
        print(
            f"{label}: median {statistics.median(times[label]):.3f} s over {len(times[label])} "
            f"(min {min(times[label]):.3f}), CPU over its ranks {statistics.median(cpu[label]):.3f} s"
        )
    ratio = statistics.median(times["base"]) / statistics.median(times["this"])
    print(f"speed-up (base / this, medians): {ratio:.2f}x")
    same = _verdicts(answers["base"]) == _verdicts(answers["this"])
    worst = _worst(answers["base"], answers["this"])
    print(f"verdicts {'equal' if same else 'DIFFERENT'}: {_verdicts(answers['this'])}")
    within = "within" if worst <= TOLERANCE else "BEYOND"
    print(f"curves: largest relative difference {worst:.2e} ({within} 1e-12)")
    median = statistics.median(times["this"])
    verdict = "PASS" if median <= 2 else "MISS"
    print(f"target <= 2 s: {verdict} ({median:.2f} s; on a loaded host this is no verdict)")
    example = run_case("lr_doc_example", args.runs, False, 0)
    probe = example["result"]["lr_scaling"]
    print(
        f"docs/lr-scaling.md's example, {probe['seeds']} seeds over the whole run's {probe['samples']:,} "
        f"samples, this tree: median {statistics.median(example['times']):.3f} s, CPU over its ranks "
        f"{statistics.median(example['cpu']):.3f} s; best {probe['best_rule']}, tied {probe['tied_for_best']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
