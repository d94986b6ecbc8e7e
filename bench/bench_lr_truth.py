"""The lr-scaling probe against real training on real data (issue 47), in two regimes.

    .venv/bin/pip install scikit-learn   # its bundled digits; nothing else is downloaded
    .venv/bin/python bench/bench_lr_truth.py [--workload digits|chars|both] [--seeds 3]
        [--batches 64,256] [--tolerance T] [--epochs E] [--base-lr LR]

digits (bench/lr_truth_digits.py), which converges within its run: scikit-learn's digits,
1,397 training and 400 held-out 8x8 images, a 64-64-10 MLP, SGD with momentum 0.9, 20 epochs,
base lr 0.1 (the best of 0.0125 to 0.2 by real training's accuracy at batch 16), judged by
held-out accuracy within 5 % (relative). chars (bench/lr_truth_chars.py), which does not: a
character language model on 16,384 windows of the standard library's source, Adam, one pass,
base lr 0.003 (the best of 0.001, 0.003, 0.01), judged by held-out cross-entropy within 0.02
nats. Both: base batch 16, a cosine decay over the run; each factory returns its referee, so
the probe judges by the user's metric.

Real training, the referee: for each global batch (4x and 16x the base batch by default), each
rule's lr (none, sqrt, linear) and each seed, torch.optim (SGD or Adam, the rule's betas and
eps) over shuffled epochs of the whole run (the schedule counted in samples, as the plan's),
its held-out metric at the end against the same seed's real base run at batch 16: a rule holds
within the tolerance in every seed, fails in none, else is borderline; real training's best
rule has the best mean ratio.

The probe, at its default length (the plan's whole run: the same samples), with --seeds seeds,
in this process on one rank (its runs are independent, so the ranks only share them out).

Printed per global batch: each rule's real and probed metric ratio per seed and outcome, real
training's best rule against the probe's best and tied rules, PASS/MISS for the issue's
criteria (the probe names real training's best rule or a tie that contains it; its outcome
agrees on every rule real training did not find borderline), and the time each took. Bench
only, never in the test suite; about 6 minutes for both on 2 loaded cores. Always exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT  # (puts the repository on the path)

sys.path.insert(0, str(ROOT / "tests"))

BASE_BATCH = 16
TOLERANCE = [0.05]  # --tolerance, in the workload's unit


@dataclasses.dataclass(frozen=True)
class Setup:
    target: str
    optimizer: str  # the plan's, and real training's torch.optim class
    base_lr: float
    samples: int  # the training set
    epochs: int
    tolerance: float
    unit: str  # "relative" or "nats" (absolute, in the metric's units)
    higher_is_better: bool


SETUPS = {
    # Converges within its run: 20 epochs of the digits, judged by accuracy.
    "digits": Setup("lr_truth_digits:digits", "sgd", 0.1, 1397, 20, 0.05, "relative", True),
    # Does not: one pass over 16,384 characters of the standard library, judged by held-out
    # cross-entropy in nats (5 % of a 2-nat loss passed an lr twice too low).
    "chars": Setup("lr_truth_chars:chars", "adam", 0.003, 16384, 1, 0.02, "nats", False),
}


def plan_body(G: int, setup: Setup, args: argparse.Namespace) -> dict[str, Any]:
    lr = {
        "base_lr": args.base_lr or setup.base_lr,
        "base_batch_size": BASE_BATCH,
        "rule": "linear",
        "decay": "cosine",
        "optimizer": setup.optimizer,
    }
    return {
        "plan": {
            "topology": {"num_nodes": 1, "gpus_per_node": 4},
            "global_batch_size": G,
            "dataset": {"num_samples": setup.samples, "epochs": args.epochs or setup.epochs},
            "learning_rate": lr,
        },
        "lr_scaling": {"seeds": args.seeds, "tolerance": TOLERANCE[0], "tolerance_unit": setup.unit},
        "timeout_s": 3600,
    }


def probe(body: dict[str, Any], target: str) -> tuple[Any, Any]:
    """(the probe's spec, its result) run here on one rank."""
    from support.one_rank import one_rank_group

    from app.contract.codec import encode
    from app.contract.request import build_spec
    from app.schemas.checks import CheckRequestIn
    from app.worker.checks.driver import run_spec
    from app.worker.training.workload import Registered

    request = CheckRequestIn.model_validate(body).to_core()
    request = dataclasses.replace(request, options=dataclasses.replace(request.options, model=target))
    spec = build_spec(request, factory=target, factory_flag=True)
    with one_rank_group() as group:
        result = run_spec(spec, group, Registered(target, target, spec.seed), target)
    assert result is not None
    return spec, encode(result)["lr_scaling"]


def real_run(setup: Setup, seed: int, batch: int, recipe: Any, G: int, samples: int) -> float:
    """Real training's held-out metric at the end of the run (torch.optim, DataLoader-style
    shuffled epochs dropping the last partial batch)."""
    import importlib

    import torch

    from app.core.learning_rate.recipe_summary import lr_of

    module, _, name = setup.target.partition(":")
    model, train, loss_fn, referee = getattr(importlib.import_module(module), name)(seed)
    x, y = train.tensors
    if setup.optimizer == "sgd":
        momentum = 0.9 if recipe.momentum is None else recipe.momentum
        optimizer: Any = torch.optim.SGD(model.parameters(), lr=recipe.lr, momentum=momentum)
    else:  # the rule's betas and eps (the square-root rule's adjusted ones)
        optimizer = torch.optim.Adam(model.parameters(), lr=recipe.lr, betas=recipe.betas, eps=recipe.eps)
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
        return float(referee["metric"](model(hx), hy))


def passes(setup: Setup, final: float, base: float) -> bool:
    """The probe's rule (seeds.passes) applied to real training's metric."""
    tol = TOLERANCE[0]
    if setup.higher_is_better:
        return final >= (base - tol if setup.unit == "nats" else base * (1 - tol))
    return final <= (base + tol if setup.unit == "nats" else base * (1 + tol))


def outcome(held: list[bool]) -> str:
    return "holds" if all(held) else "fails" if not any(held) else "borderline"


def one_batch(G: int, setup: Setup, args: argparse.Namespace) -> None:
    start = time.perf_counter()
    spec, found = probe(plan_body(G, setup, args), setup.target)
    probe_s = time.perf_counter() - start
    lr_spec, seeds = spec.lr_scaling, range(args.seeds)
    start = time.perf_counter()
    base = [real_run(setup, k, BASE_BATCH, lr_spec.base.recipe, G, lr_spec.samples) for k in seeds]
    real: dict[str, list[float]] = {}
    for run in lr_spec.runs:
        real[run.rule] = [real_run(setup, k, G, run.recipe, G, lr_spec.samples) for k in seeds]
    real_s = time.perf_counter() - start
    sign = 1 if setup.higher_is_better else -1
    means = {rule: statistics.fmean(f / b for f, b in zip(r, base, strict=True)) for rule, r in real.items()}
    real_best = max(means, key=lambda rule: sign * means[rule])
    print(
        f"\n{setup.target}: global batch {G} ({G // BASE_BATCH}x the base 16), {lr_spec.samples:,} samples, "
        f"{args.seeds} seeds, {found['metric_name']} within {TOLERANCE[0]:g} ({setup.unit}); real base "
        f"{', '.join(f'{b:.4g}' for b in base)}; probe base {found['base']['metric']:.4g} (mean)"
    )
    print(f"  {'rule':<7} {'lr':>8}  {'real ratios (outcome)':<34} {'probe ratios (outcome)':<34} agree")
    agree_all = True
    for rule in found["rules"]:
        name, finals = rule["rule"], real[rule["rule"]]
        real_outcome = outcome([passes(setup, f, b) for f, b in zip(finals, base, strict=True)])
        agree = real_outcome == "borderline" or rule["outcome"] == real_outcome
        agree_all &= agree
        ratios = " ".join(f"{f / b:.3f}" for f, b in zip(finals, base, strict=True))
        probed = " ".join("-" if r is None else f"{r:.3f}" for r in rule["seed_ratios"])
        shown_real, shown_probe = f"{ratios} ({real_outcome})", f"{probed} ({rule['outcome']})"
        print(
            f"  {name:<7} {rule['lr']:>8.4g}  {shown_real:<34} {shown_probe:<34} {'yes' if agree else 'NO'}"
        )
    tied = found["tied_for_best"]
    print(
        f"  best: real {real_best}; probe {found['best_rule']} (tied: {', '.join(tied)}): "
        f"{'PASS' if real_best in tied else 'MISS'}; outcomes where real training decided agree: "
        f"{'PASS' if agree_all else 'MISS'}"
    )
    print(f"  probe {probe_s:.1f} s (one rank), real training {real_s:.1f} s; verdict: {found['verdict']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=[*SETUPS, "both"], default="both")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=0, help="0: the workload's (digits 20, chars 1)")
    parser.add_argument(
        "--base-lr", type=float, default=0.0, help="0: the workload's (digits 0.1, chars 0.003)"
    )
    parser.add_argument("--batches", default="64,256")
    parser.add_argument(
        "--tolerance", type=float, default=0.0, help="0: the workload's (5 %% relative, 0.02 nats)"
    )
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    for name in SETUPS if args.workload == "both" else [args.workload]:
        setup = SETUPS[name]
        if name == "digits" and importlib.util.find_spec("sklearn") is None:
            print("digits: scikit-learn is not installed: pip install scikit-learn (its digits are bundled)")
            continue
        TOLERANCE[0] = args.tolerance or setup.tolerance
        for G in (int(b) for b in args.batches.split(",")):
            one_batch(G, setup, args)


if __name__ == "__main__":
    main()
