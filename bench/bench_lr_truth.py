"""The lr-scaling probe against real training on real data (issue 47).

    .venv/bin/pip install scikit-learn   # its bundled digits; nothing else is downloaded
    .venv/bin/python bench/bench_lr_truth.py [--seeds 3] [--epochs 20] [--batches 64,256] [--tolerance 0.05]

The workload (bench/lr_truth_digits.py): scikit-learn's digits, 1,397 training and 400 held-out
8x8 images, a 64-64-10 MLP, SGD with momentum 0.9 and a cosine decay over the run, base batch
16 at --base-lr (0.1: the best of 0.0125 to 0.2 by real training's accuracy at batch 16); its
factory returns its referee (the held-out images and accuracy), so the probe judges by accuracy,
as a user would.

Real training, the referee: for each global batch (4x and 16x the base batch by default), each
rule's lr (none, sqrt, linear) and each seed, torch.optim.SGD over shuffled epochs of the whole
run (--epochs passes; the schedule counted in samples, as the plan's), its held-out accuracy at
the end against the same seed's real base run at batch 16. A rule holds where it ends within
the tolerance (--tolerance, 5 % relative) of the base run's accuracy in every seed, fails where in none,
else is borderline; real training's best rule has the best mean accuracy ratio.

The probe, at its default length (the plan's whole run: the same samples), with --seeds seeds,
in this process on one rank (its runs are independent, so the ranks only share them out).

Printed per global batch: each rule's real and probed accuracy ratio per seed and outcome, real
training's best rule against the probe's best and tied rules, PASS/MISS for the issue's
criteria (the probe names real training's best rule or a tie that contains it; its outcome
agrees on every rule whose real outcome is not borderline), and the time each took. Bench only,
never in the test suite; about a few minutes on 2 cores. Always exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT  # (puts the repository on the path)

sys.path.insert(0, str(ROOT / "tests"))

TARGET = "lr_truth_digits:digits"
BASE_BATCH = 16
TOLERANCE = [0.05]  # --tolerance: relative, the probe's default


def plan_body(G: int, epochs: int, base_lr: float, seeds: int) -> dict[str, Any]:
    from lr_truth_digits import HELD_OUT

    lr = {"base_lr": base_lr, "base_batch_size": BASE_BATCH, "rule": "linear", "decay": "cosine"}
    return {
        "plan": {
            "topology": {"num_nodes": 1, "gpus_per_node": 4},
            "global_batch_size": G,
            "dataset": {"num_samples": 1797 - HELD_OUT, "epochs": epochs},
            "learning_rate": lr,
        },
        "lr_scaling": {"seeds": seeds, "tolerance": TOLERANCE[0]},
        "timeout_s": 3600,
    }


def probe(body: dict[str, Any]) -> tuple[Any, Any]:
    """(the probe's spec, its result) run here on one rank."""
    from support.one_rank import one_rank_group

    from app.contract.codec import encode
    from app.contract.request import build_spec
    from app.schemas.checks import CheckRequestIn
    from app.worker.checks.driver import run_spec
    from app.worker.training.workload import Registered

    request = CheckRequestIn.model_validate(body).to_core()
    request = dataclasses.replace(request, options=dataclasses.replace(request.options, model=TARGET))
    spec = build_spec(request, factory=TARGET, factory_flag=True)
    with one_rank_group() as group:
        result = run_spec(spec, group, Registered(TARGET, TARGET, spec.seed), TARGET)
    assert result is not None
    return spec, encode(result)["lr_scaling"]


def real_run(seed: int, batch: int, recipe: Any, G: int, samples: int) -> float:
    """Real training's held-out accuracy at the end of the run (torch.optim.SGD, DataLoader-style
    shuffled epochs dropping the last partial batch)."""
    import torch
    from lr_truth_digits import accuracy, digits

    from app.core.learning_rate.recipe_summary import lr_of

    model, train, loss_fn, referee = digits(seed)
    x, y = train.tensors
    momentum = 0.9 if recipe.momentum is None else recipe.momentum
    optimizer = torch.optim.SGD(model.parameters(), lr=recipe.lr, momentum=momentum)
    generator = torch.Generator().manual_seed(1000 + seed)
    steps, j = samples // batch, 0
    while j < steps:
        order = torch.randperm(len(x), generator=generator)
        for first in range(0, len(x) - batch + 1, batch):
            if j >= steps:
                break
            for group in optimizer.param_groups:
                group["lr"] = lr_of(recipe, (j * batch) // G)  # the plan's schedule, in samples
            idx = order[first : first + batch]
            optimizer.zero_grad()
            loss_fn(model(x[idx]), y[idx]).backward()
            optimizer.step()
            j += 1
    hx, hy = referee["held_out"].tensors
    with torch.no_grad():
        return float(accuracy(model(hx), hy))


def outcome(ratios: list[float]) -> str:
    held = [r >= 1 - TOLERANCE[0] for r in ratios]
    return "holds" if all(held) else "fails" if not any(held) else "borderline"


def one_batch(G: int, args: argparse.Namespace) -> None:
    body = plan_body(G, args.epochs, args.base_lr, args.seeds)
    start = time.perf_counter()
    spec, found = probe(body)
    probe_s = time.perf_counter() - start
    lr_spec = spec.lr_scaling
    start = time.perf_counter()
    base = [real_run(k, BASE_BATCH, lr_spec.base.recipe, G, lr_spec.samples) for k in range(args.seeds)]
    real: dict[str, list[float]] = {}
    for run in lr_spec.runs:
        finals = [real_run(k, G, run.recipe, G, lr_spec.samples) for k in range(args.seeds)]
        real[run.rule] = [f / b for f, b in zip(finals, base, strict=True)]
    real_s = time.perf_counter() - start
    means = {rule: statistics.fmean(r) for rule, r in real.items()}
    real_best = max(means, key=lambda rule: means[rule])
    print(
        f"\nglobal batch {G} ({G // BASE_BATCH}x the base 16), {lr_spec.samples:,} samples "
        f"({args.epochs} epochs), {args.seeds} seeds; real base accuracy "
        f"{', '.join(f'{b:.3f}' for b in base)}; probe base {found['base']['metric']:.3f} (mean)"
    )
    print(f"  {'rule':<7} {'lr':>8}  {'real ratios (outcome)':<34} {'probe ratios (outcome)':<34} agree")
    agree_all = True
    for rule in found["rules"]:
        name, ratios = rule["rule"], real[rule["rule"]]
        real_outcome = outcome(ratios)
        agree = real_outcome == "borderline" or rule["outcome"] == real_outcome
        agree_all &= agree
        shown_real = f"{' '.join(f'{r:.3f}' for r in ratios)} ({real_outcome})"
        shown_probe = f"{' '.join(f'{r:.3f}' for r in rule['seed_ratios'])} ({rule['outcome']})"
        print(
            f"  {name:<7} {rule['lr']:>8.4g}  {shown_real:<34} {shown_probe:<34} {'yes' if agree else 'NO'}"
        )
    tied = found["tied_for_best"]
    print(
        f"  best: real {real_best}; probe {found['best_rule']} (tied: {', '.join(tied)}): "
        f"{'PASS' if real_best in tied else 'MISS'}; outcomes outside the real spread agree: "
        f"{'PASS' if agree_all else 'MISS'}"
    )
    print(f"  probe {probe_s:.1f} s (one rank), real training {real_s:.1f} s; verdict: {found['verdict']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--base-lr", type=float, default=0.1)
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--tolerance", type=float, default=0.05, help="relative, for both referees")
    args = parser.parse_args()
    TOLERANCE[0] = args.tolerance
    try:
        import sklearn  # noqa: F401
    except ImportError:
        print("scikit-learn is not installed: .venv/bin/pip install scikit-learn (its digits are bundled)")
        return
    import torch

    torch.set_num_threads(1)
    for G in (int(b) for b in args.batches.split(",")):
        one_batch(G, args)


if __name__ == "__main__":
    main()
