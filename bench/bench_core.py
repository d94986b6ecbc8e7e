"""Core planner benchmark: app.core.planner.plan() in-process, no HTTP.

Issue 2: response size and time depend on the number of distinct replica settings,
never on the number of GPUs.

Targets
  T1  homogeneous 100,000 GPUs (12,500 nodes x 8), dataset + learning rate: median < 1 ms
  T2  10,000 node groups, mixed throughputs and caps (seeded): median < 100 ms
  T3  homogeneous 1k..10M GPUs: flat (1 replica group; slowest/fastest median < 2x)
  T4  mixed, same groups with 100x the GPUs: same replica groups, time ratio < 2x
  T5  infeasible requests (suggestions computed) are as fast as T1/T2 for their size:
      16-GPU error < 1 ms, 10k-group errors < 100 ms
  T6  plans from throughput curves (issue 38): 10k groups of four GPU kinds' curves (pooled
      like T2) < 3x T2 in the same run; 10k groups, every group its own curve (80,000 points,
      no pooling), at most 2x the 1k case's time per group (< 20x: about linear, the rest
      being this machine's caches, not the algorithm's order)

Baselines measured in the same run: a trivial Python call and constructing the request
dataclasses, so figures can be read relative to this machine's speed.

    .venv/bin/python bench/bench_core.py            # full, ~40 s
    .venv/bin/python bench/bench_core.py --quick    # smoke, a few seconds

Always exits 0; prints PASS/MISS per target.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Timing, fmt_time, machine_line, measure, table, verdict

from app.core.errors.domain import PlanError
from app.core.planner import plan
from app.core.records.plan_request import (
    DatasetSpec,
    Divisibility,
    LearningRateSpec,
    NodeGroup,
    PlanRequest,
    Topology,
)
from app.core.records.throughput_curve import ThroughputCurve

IMAGENET = 1_281_167


def homogeneous(num_nodes: int, gpus_per_node: int = 8, per_replica: int = 4) -> PlanRequest:
    world = num_nodes * gpus_per_node
    return PlanRequest(
        topology=Topology.homogeneous(num_nodes, gpus_per_node),
        global_batch_size=world * per_replica,
        dataset=DatasetSpec(num_samples=IMAGENET, shuffle=True, seed=0, epochs=90),
        learning_rate=LearningRateSpec(base_lr=0.1, base_batch_size=256, warmup_epochs=5),
    )


def mixed_groups(n: int, seed: int = 0, node_scale: int = 1, capped: bool = False) -> tuple[NodeGroup, ...]:
    rng = random.Random(seed)
    caps = (16, 32, 64) if capped else (None, 16, 32, 64)
    return tuple(
        NodeGroup(
            name=f"g{i}",
            num_nodes=rng.randint(1, 8) * node_scale,
            gpus_per_node=rng.choice((1, 2, 4, 8)),
            relative_throughput=rng.choice((0.5, 1.0, 1.5, 2.0, 3.0)),
            max_micro_batch_size=rng.choice(caps),
        )
        for i in range(n)
    )


def mixed(n: int, *, node_scale: int = 1, per_replica: int = 8, **extra: object) -> PlanRequest:
    topology = Topology(node_groups=mixed_groups(n, node_scale=node_scale), listed_groups=True)
    kwargs: dict[str, object] = dict(
        global_batch_size=topology.world_size * per_replica,
        dataset=DatasetSpec(num_samples=10**9, epochs=3),
        learning_rate=LearningRateSpec(base_lr=0.1, warmup_epochs=1),
    )
    kwargs.update(extra)
    return PlanRequest(topology=topology, **kwargs)  # type: ignore[arg-type]


def saturating_curve(rng: random.Random, cap: int | None) -> ThroughputCurve:
    """Samples/s at powers of two up to the cap (64 without one), as a throughput check measures
    them: rising to a peak, sometimes falling after it (memory pressure)."""
    top = cap or 64
    sizes = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= top]
    peak, half = rng.uniform(200, 3000), rng.uniform(1, 16)
    rates = [peak * b / (b + half) for b in sizes]
    if rng.random() < 0.3 and len(rates) > 2:
        rates[-1] *= rng.uniform(0.7, 0.95)
    return ThroughputCurve(tuple(sizes), tuple(rates))


def curved(n: int, kinds: int | None = None, per_replica: int = 8, seed: int = 0) -> PlanRequest:
    """`mixed(n)`'s cluster with throughput curves instead of relative throughputs: one curve per
    GPU kind (`kinds` of them, as measured once per kind), or one per group (None)."""
    rng = random.Random(seed + 1)
    groups = mixed_groups(n, seed)
    kind_curves = [saturating_curve(rng, None) for _ in range(kinds or 0)]
    with_curves = []
    for i, g in enumerate(groups):
        curve = kind_curves[i % kinds] if kinds else saturating_curve(rng, g.max_micro_batch_size)
        cap = g.max_micro_batch_size if not kinds else None
        with_curves.append(
            dataclasses.replace(g, relative_throughput=1.0, max_micro_batch_size=cap, throughput_curve=curve)
        )
    topology = Topology(node_groups=tuple(with_curves), listed_groups=True)
    return PlanRequest(
        topology=topology,
        global_batch_size=topology.world_size * per_replica,
        dataset=DatasetSpec(num_samples=10**9, epochs=3),
        learning_rate=LearningRateSpec(base_lr=0.1, warmup_epochs=1),
    )


def run_plan(request: PlanRequest) -> tuple[str, object]:
    try:
        return "ok", plan(request)
    except PlanError as err:
        return "422", err


def json_size(result: object) -> int:
    if isinstance(result, PlanError):
        body = {"detail": result.detail, "suggestions": result.suggestions}
    else:
        body = dataclasses.asdict(result)  # type: ignore[call-overload]
    return len(json.dumps(body).encode())


def case(
    label: str, request: PlanRequest, budget: float, max_samples: int = 2000
) -> tuple[Timing, dict[str, object]]:
    outcome, result = run_plan(request)
    timing = measure(
        label,
        lambda: run_plan(request),
        budget_s=budget,
        min_samples=1 if budget < 0.2 else 3,
        max_samples=max_samples,
    )
    info: dict[str, object] = {
        "outcome": outcome,
        "gpus": request.topology.world_size,
        "node_groups": len(request.topology.node_groups),
        "replica_groups": len(result.replica_groups) if outcome == "ok" else "-",  # type: ignore[union-attr]
        "bytes": json_size(result),
        "suggestions": result.suggestions if outcome == "422" else None,  # type: ignore[union-attr]
    }
    return timing, info


def row(t: Timing, info: dict[str, object], unit: float) -> list[str]:
    return [
        t.label,
        str(info["outcome"]),
        f"{info['gpus']:,}",
        f"{info['node_groups']:,}",
        str(info["replica_groups"]),
        f"{info['bytes']:,}",
        fmt_time(t.median),
        fmt_time(t.p90),
        str(len(t.samples_s)),
        f"{t.median / unit:,.0f}x",
    ]


HEAD = ["case", "out", "GPUs", "node grp", "replica grp", "JSON B", "median", "p90", "n", "vs ctor"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run, a few seconds")
    args = ap.parse_args()
    quick = args.quick
    b_fast = 0.05 if quick else 1.5  # budget per fast case (seconds)
    b_slow = 0.05 if quick else 3.0  # budget per slow (10k-group) case

    print(f"bench_core  ({'quick' if quick else 'full'})  {machine_line()}")
    started = time.perf_counter()

    # ---- baselines
    trivial = measure("trivial call", lambda: None, budget_s=b_fast / 3)
    ctor = measure("construct 100k-GPU PlanRequest", lambda: homogeneous(12_500), budget_s=b_fast / 3)
    unit = ctor.median
    print("\nbaselines (this machine, this run)")
    print(
        table(
            ["baseline", "median", "p90"],
            [[t.label, fmt_time(t.median), fmt_time(t.p90)] for t in (trivial, ctor)],
        )
    )

    rows: list[list[str]] = []
    results: dict[str, tuple[Timing, dict[str, object]]] = {}

    def add(key: str, label: str, request: PlanRequest, budget: float, max_samples: int = 2000) -> None:
        t, info = case(label, request, budget, max_samples)
        results[key] = (t, info)
        rows.append(row(t, info, unit))

    # ---- targets
    add("t1", "T1 homogeneous 12,500x8", homogeneous(12_500), b_fast * 2)
    add("t2", "T2 mixed 10k groups exact", mixed(10_000), b_slow)

    # ---- scaling: homogeneous, GPUs 1k..10M
    sizes = [(125, "1k"), (1_250, "10k"), (12_500, "100k"), (125_000, "1M"), (1_250_000, "10M")]
    for nodes, name in sizes:
        add(f"h{name}", f"homogeneous {name} GPUs", homogeneous(nodes), b_fast)
    # ---- scaling: node groups 10..10k (the 10k row is T2), and 100x GPUs at fixed groups
    for n in (10, 100, 1_000):
        add(f"m{n}", f"mixed {n:,} groups", mixed(n), b_fast)
    add("m1000x100", "mixed 1,000 groups, 100x nodes", mixed(1_000, node_scale=100), b_fast)

    # ---- plans from throughput curves (issue 38): a curve each, 10..10k groups; four kinds
    for n in (10, 100, 1_000, 10_000):
        add(f"c{n}", f"curves {n:,} groups, a curve each", curved(n), b_slow if n == 10_000 else b_fast)
    add("ck4", "curves 10k groups, 4 kinds", curved(10_000, kinds=4), b_slow)

    # ---- infeasible requests (422 with suggestions)
    small = PlanRequest(
        topology=Topology.homogeneous(2, 8), global_batch_size=2**53 - 1, divisibility=Divisibility.EXACT
    )
    add("e16", "E 16 GPUs, global 2^53-1, exact", small, b_fast)
    world10k = mixed(10_000).topology.world_size
    add(
        "erd",
        "E mixed 10k, global D-1, round_down",
        mixed(10_000, global_batch_size=world10k - 1, divisibility=Divisibility.ROUND_DOWN),
        b_slow,
        max_samples=10,
    )
    add(
        "eg7",
        "E mixed 10k, accumulation 7, exact",
        mixed(10_000, gradient_accumulation_steps=7),
        b_slow,
        max_samples=5,
    )

    print("\nresults (median/p90 per plan() call; 'vs ctor' = median / request-construction median)")
    print(table(HEAD, rows))

    # ---- verdicts
    def med(key: str) -> float:
        return results[key][0].median

    homog = [results[f"h{name}"] for _, name in sizes]
    h_meds = [t.median for t, _ in homog]
    h_groups = {info["replica_groups"] for _, info in homog}
    flat = max(h_meds) / min(h_meds)
    m_small, m_big = results["m1000"], results["m1000x100"]
    gpu_ratio = m_big[0].median / m_small[0].median
    same_groups = m_small[1]["replica_groups"] == m_big[1]["replica_groups"]
    err10k = max(med("erd"), med("eg7"))
    curve_ratio = med("c10000") / med("c1000")
    kinds_ratio = med("ck4") / med("t2")
    ok_all = all(info["outcome"] == "ok" for k, (_, info) in results.items() if not k.startswith("e"))
    err_all = all(info["outcome"] == "422" for k, (_, info) in results.items() if k.startswith("e"))

    targets = [
        [
            "T1 homogeneous 100k GPUs median < 1 ms",
            f"{fmt_time(med('t1'))} (p90 {fmt_time(results['t1'][0].p90)})",
            f"{med('t1') / 1e-3:.2f}",
            verdict(med("t1") < 1e-3 and results["t1"][0].p90 < 1e-3),
        ],
        [
            "T2 10k node groups median < 100 ms",
            f"{fmt_time(med('t2'))} (p90 {fmt_time(results['t2'][0].p90)})",
            f"{med('t2') / 0.1:.2f}",
            verdict(med("t2") < 0.1),
        ],
        [
            "T3 homogeneous 1k..10M flat (< 2x, 1 group)",
            f"max/min {flat:.2f}x, groups {sorted(map(str, h_groups))}",
            f"{flat / 2:.2f}",
            verdict(flat < 2 and h_groups == {1}),
        ],
        [
            "T4 mixed 1k groups: 100x GPUs < 2x time",
            f"{gpu_ratio:.2f}x, same groups: {same_groups}",
            f"{gpu_ratio / 2:.2f}",
            verdict(gpu_ratio < 2 and same_groups),
        ],
        [
            "T5a 16-GPU infeasible < 1 ms",
            fmt_time(med("e16")),
            f"{med('e16') / 1e-3:.2f}",
            verdict(med("e16") < 1e-3),
        ],
        ["T5b 10k-group infeasible < 100 ms", fmt_time(err10k), f"{err10k / 0.1:.2f}", verdict(err10k < 0.1)],
        [
            "T6a curves, 10k groups of 4 kinds < 3x T2",
            f"{kinds_ratio:.2f}x ({fmt_time(med('ck4'))})",
            f"{kinds_ratio / 3:.2f}",
            verdict(kinds_ratio < 3),
        ],
        [
            "T6b curves, a curve each: 10k/1k groups < 20x",
            f"{curve_ratio:.2f}x ({fmt_time(med('c1000'))} -> {fmt_time(med('c10000'))})",
            f"{curve_ratio / 20:.2f}",
            verdict(curve_ratio < 20),
        ],
        [
            "sanity: feasible cases ok, error cases 422",
            f"{ok_all and err_all}",
            "-",
            verdict(ok_all and err_all),
        ],
    ]
    print("\ntargets (ratio = figure / target; < 1 meets it)")
    print(table(["target", "figure", "ratio", "verdict"], targets))
    print(
        f"\nper group, mixed: 10 -> {fmt_time(med('m10') / 10)}/group, "
        f"10k -> {fmt_time(med('t2') / 10_000)}/group;"
        f" homogeneous 100k / ctor = {med('t1') / unit:.0f}x; trivial call {fmt_time(trivial.median)}"
    )
    print(
        f"suggestions: 16 GPUs {results['e16'][1]['suggestions']}; "
        f"10k round_down {results['erd'][1]['suggestions']}"
    )
    print(f"finished in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
