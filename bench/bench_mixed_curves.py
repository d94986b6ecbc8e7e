"""An emulated mixed cluster on this machine (issue 38): a plan from measured throughput curves
against the plan from the best scalar relative_throughput, both run as real DDP steps.

    .venv/bin/python bench/bench_mixed_curves.py [--quota 0.5] [--steps 100] [--rounds 5]

(As root: it makes a cgroup v1 cpu group, /sys/fs/cgroup/cpu/batchplan-bench-<pid>, and removes it.)

Two gloo ranks, one thread each: rank 0 is the "fast" node group, rank 1 the "slow" one, moved
into a cgroup whose CPU quota is --quota of one core (cpu.cfs_quota_us over a 2 ms
cpu.cfs_period_us). Why that is a fair stand-in for a slower GPU type: every operation of the
slow rank, its per-step fixed costs (Python, dispatch, kernel launches) as well as its
arithmetic, gets a fraction of the time the fast rank's gets, as on an older device that is
slower at both; and the planner is told nothing of it: it sees only the two measured curves.
What it does not emulate: a GPU whose fixed costs and arithmetic slow down by different factors
(that only makes the curves differ more in shape, which is what the curve split exploits).

1. Each rank in turn (the other waits at a barrier) measures its curve of the bench's model (a
   12-layer MLP of width 64, float32: fixed costs matter at small micro-batches), a micro-step as
   the replica runs it between all-reduces (DDP's forward under no_sync(): the service times the
   bare model, whose DDP costs are negligible beside a GPU step but not beside these 0.1-1 ms
   CPU steps), with the service's own timed loop (app.worker.measure.throughput.time_sizes),
   each repeat at least 20 ms (10 periods of the quota), three passes taking turns, a point the median of its
   passes (a burst of load from elsewhere on the shared host moves one pass, not the curve).
2. Rank 0 plans the global batch from the two curves (node_groups[].throughput_curve), and from
   each scalar relative_throughput the curves suggest (the peak samples/s ratio, and the ratio at
   each measured micro-batch), keeping the scalar plan whose split the curves predict fastest;
   both at the same accumulation.
3. Both plans run as real DDP optimizer steps (each replica its plan micro-batch, the plan's loss
   scales, no_sync but the last micro-batch, SGD), in alternating rounds, each step timed on rank
   0 (the all-reduce that ends a step waits for the slow rank); the median step of each plan.
Reported: predicted and measured step times side by side, and the curve split's margin over the
scalar one, predicted and measured. Target: the curve split measured faster, by the predicted
margin within 25 %, checked two ways: as a fraction of the step, and in time saved per step.
Neither is exact here: a measured step adds the all-reduce to the compute the curves predict
(the same parameters for both splits), which dilutes a margin in percent but not in seconds,
while load from elsewhere on the host slows every step by a factor, which keeps a margin in
percent but not in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT

SIZES = [1, 2, 4, 8, 16, 32, 64]
GLOBAL_BATCH, ACCUMULATION, CAP = 192, 4, 64
CGROUP = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 2000
# A repeat lasts 10 periods of the quota or more, so that its throttling averages out.
REPEAT_S = 0.02
PASSES = 3


def model(torch: Any) -> Any:
    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(12):
        layers += [torch.nn.Linear(64, 64), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(64, 1))


def rank_main(rank: int, port: int, cgroup: str, steps: int, rounds: int) -> None:
    if rank == 1:
        Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from app.worker.measure.throughput import time_sizes

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    module = model(torch)
    data = torch.randn(CAP, 64), torch.randn(CAP, 1)

    def loss(m: Any, x: Any, y: Any) -> Any:
        return torch.nn.functional.mse_loss(m(x), y)

    # Each rank measures its curve PASSES times, the ranks taking turns (the other waits at a
    # barrier), and each point is the median of its passes: a burst of load from elsewhere on the
    # host moves one pass, not the curve.
    passes: list[list[float]] = []
    cpu = torch.device("cpu")
    ddp = DistributedDataParallel(module)

    def replica_loss(m: Any, x: Any, y: Any) -> Any:
        # A micro-step as a replica runs it between all-reduces: DDP's forward under no_sync()
        # (its backward then reduces nothing), so DDP's own per-micro-step costs are in the curve.
        with ddp.no_sync():
            return loss(ddp, x, y)

    for _ in range(PASSES):
        for who in (0, 1):
            if rank == who:
                batch = lambda n: (data[0][:n].clone(), data[1][:n].clone())  # noqa: E731
                timed, _ = time_sizes(
                    ddp,
                    replica_loss,
                    batch,
                    SIZES,
                    cpu,
                    repeats=10,
                    warmup=3,
                    optimizer=False,
                    min_repeat_s=REPEAT_S,
                )
                rates = [b / timed[b].median for b in SIZES]
                passes.append(rates)
            dist.barrier()
    mine = [
        {"micro_batch_size": b, "samples_per_s": round(statistics.median(p[i] for p in passes), 3)}
        for i, b in enumerate(SIZES)
    ]
    curves = [mine]
    gathered: list[Any] = [None, None]
    dist.all_gather_object(gathered, curves[0] if curves else None)
    splits: list[Any] = [None]
    if rank == 0:
        splits = [plan_both(gathered)]
    dist.broadcast_object_list(splits, src=0)
    report = splits[0]
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-4)
    times: dict[str, list[float]] = {"curve": [], "scalar": []}
    for _ in range(rounds):
        for name in ("curve", "scalar"):
            b, scale = report[name]["micro_batch_sizes"][rank], report[name]["loss_scales"][rank]
            x, y = data[0][:b].clone(), data[1][:b].clone()
            dist.barrier()
            for k in range(steps + 5):
                started = time.perf_counter()
                optimizer.zero_grad(set_to_none=False)
                for micro in range(ACCUMULATION):
                    if micro < ACCUMULATION - 1:
                        with ddp.no_sync():
                            (loss(ddp, x, y) * scale / ACCUMULATION).backward()
                    else:
                        (loss(ddp, x, y) * scale / ACCUMULATION).backward()
                optimizer.step()
                if k >= 5:
                    times[name].append(time.perf_counter() - started)
    if rank == 0:
        report["measured"] = {name: statistics.median(v) for name, v in times.items()}
        report["curves"] = gathered
        print(json.dumps(report))
    dist.destroy_process_group()


def plan_both(curves: list[list[dict[str, float]]]) -> dict[str, Any]:
    from app.core.planner import plan
    from app.core.records.throughput_curve import StepTime, ThroughputCurve
    from app.core.request.parse import plan_request

    timers = [
        StepTime.of(
            ThroughputCurve(tuple(p["micro_batch_size"] for p in c), tuple(p["samples_per_s"] for p in c))
        )
        for c in curves
    ]

    def group(name: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "num_nodes": 1, "gpus_per_node": 1, "max_micro_batch_size": CAP, **extra}

    def planned(groups: list[dict[str, Any]]) -> dict[str, Any]:
        request = {
            "topology": {"node_groups": groups},
            "global_batch_size": GLOBAL_BATCH,
            "gradient_accumulation_steps": ACCUMULATION,
        }
        p = plan(plan_request(request))
        sizes = [g.micro_batch_size for g in p.replica_groups for _ in range(g.start, g.stop)]
        scales = [g.loss_scale or 1.0 for g in p.replica_groups for _ in range(g.start, g.stop)]
        predicted = ACCUMULATION * max(t.at(b) for t, b in zip(timers, sizes, strict=True))
        return {"micro_batch_sizes": sizes, "loss_scales": scales, "predicted_step_s": predicted}

    curve = planned([group("fast", throughput_curve=curves[0]), group("slow", throughput_curve=curves[1])])
    rates = [{p["micro_batch_size"]: p["samples_per_s"] for p in c} for c in curves]
    ratios = {"peak": max(rates[0].values()) / max(rates[1].values())}
    ratios |= {f"at {b}": rates[0][b] / rates[1][b] for b in SIZES}
    scalars = {
        why: {
            **planned([group("fast", relative_throughput=r), group("slow", relative_throughput=1.0)]),
            "ratio": r,
            "why": why,
        }
        for why, r in ratios.items()
    }
    best = min(scalars.values(), key=lambda s: s["predicted_step_s"])
    return {"curve": curve, "scalar": best, "scalar_candidates": list(scalars.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quota", type=float, default=0.5, help="the slow rank's share of one core")
    parser.add_argument("--steps", type=int, default=100, help="timed DDP steps per plan and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cgroup", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.port, args.cgroup, args.steps, args.rounds)
        return
    from app.ports import free_port

    group = CGROUP / f"batchplan-bench-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(int(PERIOD_US * args.quota)))
        print(f"load average at start: {os.getloadavg()}; slow rank: {args.quota:g} of a core ({group})")
        port = free_port()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        argv = [sys.executable, __file__, "--port", str(port), "--cgroup", str(group)]
        argv += ["--steps", str(args.steps), "--rounds", str(args.rounds)]
        ranks = [subprocess.Popen([*argv, "--rank", str(r)], env=env, stdout=subprocess.PIPE) for r in (0, 1)]
        out = ranks[0].communicate(timeout=900)[0].decode()
        ranks[1].wait(timeout=60)
    finally:
        group.rmdir()
    report(json.loads(out.strip().splitlines()[-1]))
    print(f"load average at end: {os.getloadavg()}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:7.3f} ms"


def report(r: dict[str, Any]) -> None:
    for name, curve in zip(("fast", "slow"), r["curves"], strict=True):
        points = ", ".join(f"{p['micro_batch_size']}:{p['samples_per_s']:.0f}" for p in curve)
        print(f"{name} curve (micro-batch:samples/s): {points}")
    for c in r["scalar_candidates"]:
        print(
            f"  scalar {c['why']:>6}, ratio {c['ratio']:.3f}: split {c['micro_batch_sizes']}, "
            f"predicted {_ms(c['predicted_step_s'])}"
        )
    curve, scalar, measured = r["curve"], r["scalar"], r["measured"]
    rows = [
        ("from the curves", curve, measured["curve"]),
        (f"best scalar ({scalar['why']}, {scalar['ratio']:.2f})", scalar, measured["scalar"]),
    ]
    print(f"{'plan':>28} {'micro-batches':>14} {'predicted':>10} {'measured':>10}")
    for label, p, m in rows:
        print(f"{label:>28} {p['micro_batch_sizes']!s:>14} {_ms(p['predicted_step_s'])} {_ms(m)}")
    predicted = scalar["predicted_step_s"] / curve["predicted_step_s"] - 1
    real = measured["scalar"] / measured["curve"] - 1
    saved, saved_real = (
        scalar["predicted_step_s"] - curve["predicted_step_s"],
        measured["scalar"] - measured["curve"],
    )
    relative = "PASS" if predicted > 0 and abs(real - predicted) <= 0.25 * predicted else "MISS"
    print(
        f"curve split faster by {real * 100:.1f}% measured [{'PASS' if real > 0 else 'MISS'}: > 0], "
        f"{predicted * 100:.1f}% predicted [{relative}: within 25 % of it, as a fraction of the step]"
    )
    close = "PASS" if saved > 0 and abs(saved_real - saved) <= 0.25 * saved else "MISS"
    print(
        f"a step's time saved: {_ms(saved_real)} measured, {_ms(saved)} predicted "
        f"({(saved_real / saved - 1) * 100:+.0f}%) [{close}: within 25 % of the predicted margin]"
    )
    overhead = [m - p["predicted_step_s"] for _, p, m in rows]
    print(
        "a measured step beyond the predicted compute (the all-reduce, the same parameters for both "
        f"splits, and whatever else the host ran meanwhile): {_ms(overhead[0])} and {_ms(overhead[1])}"
    )


if __name__ == "__main__":
    main()
