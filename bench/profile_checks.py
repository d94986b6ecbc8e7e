"""Where a check's rank time goes: warm gloo ranks in this process tree, no HTTP.

    .venv/bin/python bench/profile_checks.py [--case ddp8 ...] [--runs 7] [--profile] [--top 25]
                                              [--results out.json]

Forks one process per rank, imports torch and builds a DDP model once in each (as a warm rank
does), then runs each case's check `--runs` times after one discarded run, all on one
process group, as warm ranks keep theirs from check to check (`rank/kept_group.py`). It
prints per case the median rank time (rank 0, from a barrier before the check to the end of
the check) and rank 0's laps; with
`--profile`, cProfile of rank 0 over the counted runs (the top functions by own time and by
cumulative time). `--results` writes rank 0's results without their timings (the
deterministic fields), to diff two trees' answers.

`--base DIR` compares with another revision side by side (a worktree of it: `git worktree add
/tmp/base REV`): each case runs `--rounds` times in turn under that tree and this one (each a
fresh process tree of this script with that tree first on PYTHONPATH: one measurement of both
apps), and the script prints each tree's median rank time, its median CPU time summed over the
ranks (the work done, which other load on the host moves less than it moves the wall time),
their ratios (this tree / base), and whether the deterministic fields of both answers are
equal.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import multiprocessing as mp
import os
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if os.environ.get("PYTHONPATH") is None:
    sys.path.insert(0, str(HERE.parent))


def _plan(replicas: int, **more: Any) -> dict[str, Any]:
    return {"topology": {"num_nodes": 1, "gpus_per_node": replicas}, **more}


def _mesh(parallelism: dict[str, int]) -> dict[str, Any]:
    return _plan(4, micro_batch_size=3, gradient_accumulation_steps=4, parallelism=parallelism)


def _tokens(replicas: int, global_sequences: int) -> dict[str, Any]:
    """Sequences of 16 tokens, 4 a micro-batch, the loss averaged over tokens."""
    return _plan(
        replicas,
        sequence_length=16,
        global_batch_tokens=global_sequences * 16,
        micro_batch_tokens=4 * 16,
        loss_normalization="token",
    )


MIXED_100K: dict[str, Any] = {
    "topology": {
        "node_groups": [
            {
                "name": "h100",
                "num_nodes": 5000,
                "gpus_per_node": 8,
                "relative_throughput": 2.0,
                "max_micro_batch_size": 4,
            },
            {
                "name": "a100",
                "num_nodes": 5000,
                "gpus_per_node": 8,
                "relative_throughput": 1.5,
                "max_micro_batch_size": 4,
            },
            {
                "name": "v100",
                "num_nodes": 2500,
                "gpus_per_node": 8,
                "relative_throughput": 1.0,
                "max_micro_batch_size": 4,
            },
        ]
    },
    "global_batch_size": 300_000,
    "divisibility": "balance",
    "dataset": {"num_samples": 1_000_003, "shuffle": True, "seed": 0, "drop_last": False},
}

# name: (processes, check request). bench_checks.py's bodies, and the 262,144-sample check.
CASES: dict[str, tuple[int, dict[str, Any]]] = {
    "ddp2": (2, {"plan": _plan(2, global_batch_size=16, micro_batch_size=4)}),
    "ddp4": (4, {"plan": _plan(4, global_batch_size=32, micro_batch_size=4)}),
    "ddp8": (8, {"plan": _plan(8, global_batch_size=64, micro_batch_size=4)}),
    "tokens8": (8, {"plan": _tokens(8, 64)}),
    "dp2_x_tp2": (4, {"plan": _mesh({"tensor": 2})}),
    "pp2_x_dp2": (4, {"plan": _mesh({"pipeline": 2})}),
    "fsdp4": (4, {"plan": _mesh({"data_parallel_shard": 4})}),
    "samples_262144": (
        2,
        {"plan": _plan(2, global_batch_size=1 << 18, micro_batch_size=1 << 15, loss_reduction="sum")},
    ),
    # The issue-51 scale: `batchplan check --gpus-per-node 4096 -b 8192 -m 2 --processes 2`, and
    # a 100,000-replica mixed cluster (three node groups, micro-batches 2-4, a padded dataset).
    "ddp4096": (2, {"plan": _plan(4096, global_batch_size=8192, micro_batch_size=2)}),
    "mixed100k": (2, {"plan": MIXED_100K}),
    # Runs of several steps, after the first step's check (the run kinds).
    "ddp4_run8": (4, {"plan": _plan(4, global_batch_size=32, micro_batch_size=4), "steps": 8}),
    "tokens4_run6": (4, {"plan": _tokens(4, 32), "steps": 6}),
    # The lr-scaling probe at small batches: 8,192 base steps and 4,096 a rule.
    "lr_probe16": (
        2,
        {
            "plan": _plan(
                2,
                global_batch_size=16,
                learning_rate={"base_lr": 0.01, "base_batch_size": 8, "rule": "linear"},
            ),
            "lr_scaling": {"samples": 65536, "seeds": 1},
        },
    ),
    # docs/lr-scaling.md's example probe, at its default 3 seeds (this tree's only).
    "lr_doc_example": (
        2,
        {
            "plan": _plan(
                2,
                global_batch_size=256,
                learning_rate={
                    "base_lr": 0.005,
                    "base_batch_size": 32,
                    "rule": "sqrt",
                    "warmup_steps": 8,
                    "decay": "linear",
                    "train_samples": 65536,
                },
            ),
            "lr_scaling": {},
        },
    ),
    "dp2_x_tp2_run6": (4, {"plan": _mesh({"tensor": 2}), "steps": 6}),
}


def _rank(rank: int, world: int, port: int, request: dict[str, Any], args: dict[str, Any], out: Any) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import PrefixStore, TCPStore

    from app.worker.checks.result_parts import CheckGroup
    from app.worker.training.workload import load

    try:
        from app.contract.codec import encode
        from app.contract.request import build_spec, check_request
        from app.worker.checks.driver import run_spec
    except ImportError:  # --base at b02164f (issue 36's "today's main"): its names then
        from app.worker.checks.check_kinds import run_spec
        from app.worker.contract.request import build_spec, check_request

        def encode(result: Any) -> Any:
            return result.to_json()

    torch.set_num_threads(1)
    request = _known_to_this_tree(request)
    store = TCPStore("127.0.0.1", port, world, rank == 0, timeout=timedelta(seconds=300))
    spec = build_spec(check_request(request))
    workload = load(spec.model, None, spec.seed)
    device = torch.device("cpu")
    profiler = cProfile.Profile() if args["profile"] and rank == 0 else None
    times: list[float] = []
    cpu: list[float] = []  # this rank's CPU seconds a run: less moved by other load than times
    results: list[Any] = []
    # One group for every run, as a warm rank keeps its group from one check to the next.
    dist.init_process_group("gloo", store=PrefixStore("checks", store), rank=rank, world_size=world)
    try:
        for run in range(args["runs"] + 1):
            dist.barrier()
            counted = run > 0
            if profiler is not None and counted:
                profiler.enable()
            started, cpu_started = time.perf_counter(), time.process_time()
            result = run_spec(spec, CheckGroup(rank, world, device, "gloo"), workload, None)
            cpu_spent = time.process_time() - cpu_started
            dist.barrier()
            elapsed = time.perf_counter() - started
            if profiler is not None and counted:
                profiler.disable()
            if counted:
                times.append(elapsed)
                cpu.append(cpu_spent)
                results.append(result)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        out.send({"cpu": cpu})
        return
    last = results[-1]
    payload = encode(last)
    stats_text = ""
    if profiler is not None:
        buffer = io.StringIO()
        stats = pstats.Stats(profiler, stream=buffer)
        stats.sort_stats("tottime").print_stats(args["top"])
        stats.sort_stats("cumulative").print_stats(args["top"])
        stats_text = buffer.getvalue()
    out.send({"times": times, "cpu": cpu, "result": payload, "profile": stats_text})


def _known_to_this_tree(request: dict[str, Any]) -> dict[str, Any]:
    """The request without the lr-scaling options the tree on the path predates (`seeds` before
    issue 47): a revision before it trained one seed, which is what the case asks of both."""
    try:
        from app.contract.kinds.lr_scaling import LrScalingOptions
    except ImportError:  # 9c82496: before the check kinds had their own modules
        from app.contract.options import LrScalingOptions  # type: ignore[import-not-found,no-redef]
    probe = request.get("lr_scaling")
    if not isinstance(probe, dict):
        return request
    known = set(getattr(LrScalingOptions, "__dataclass_fields__", probe))
    return {**request, "lr_scaling": {k: v for k, v in probe.items() if k in known}}


def run_case(name: str, runs: int, profile: bool, top: int) -> dict[str, Any]:
    from app.ports import free_port

    world, request = CASES[name]
    port = free_port()
    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    args = {"runs": runs, "profile": profile, "top": top}
    procs = [ctx.Process(target=_rank, args=(r, world, port, request, args, send)) for r in range(world)]
    for p in procs:
        p.start()
    # This end closed here, a rank that dies before it answers ends the read (EOFError) instead
    # of leaving it waiting for ever: a revision that cannot run the case then exits non-zero.
    send.close()
    try:
        answers = [receive.recv() for _ in procs]
    except EOFError:
        for p in procs:
            p.join(timeout=10)
        codes = [p.exitcode for p in procs]
        raise SystemExit(f"{name}: a rank died before it answered (exit codes {codes})") from None
    for p in procs:
        p.join(timeout=120)
    answer = next(a for a in answers if "result" in a)
    # A run's CPU seconds over all its ranks: the work the check did, whoever waited for whom.
    answer["cpu"] = [sum(run) for run in zip(*(a["cpu"] for a in answers), strict=True)]
    return dict(answer)


def _deterministic(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "timings_s"}


def _one_tree(tree: Path, case: str, runs: int) -> dict[str, Any]:
    """One case under `tree`'s `app`, in a fresh process: its rank times and its answer."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "answer.json"
        subprocess.run(
            [
                sys.executable,
                # This bench under both trees (PYTHONPATH picks the app): one measurement
                __file__,
                "--case",
                case,
                "--runs",
                str(runs),
                "--raw",
                str(out),
            ],
            env={**os.environ, "PYTHONPATH": str(tree)},
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return dict(json.loads(out.read_text()))


# Cases a revision before issue 51 would take hours over: bench_replicas.py leaves them out too.
BASE_TOO_SLOW = {"mixed100k": "a sampler and a backward per replica: hours at 3 rounds"}


def compare(base: Path, cases: list[str], runs: int, rounds: int) -> None:
    """Each case under both trees in turn, `rounds` times: medians over every counted run."""
    this = HERE.parent
    print(f"base {base}, this tree {this}; {rounds} rounds of {runs} runs each, in turn")
    for case in cases:
        if case in BASE_TOO_SLOW:
            median = statistics.median(t for _ in range(rounds) for t in _one_tree(this, case, runs)["times"])
            print(f"{case}: this {median:.4f} s; base not run ({BASE_TOO_SLOW[case]})")
            continue
        times: dict[str, list[float]] = {"base": [], "this": []}
        cpu: dict[str, list[float]] = {"base": [], "this": []}
        answers: dict[str, Any] = {}
        try:
            for turn in range(rounds):
                # Each round in the other order: a host whose load drifts favours neither tree.
                order = (("base", base), ("this", this))
                for label, tree in order if turn % 2 == 0 else order[::-1]:
                    answer = _one_tree(tree, case, runs)
                    times[label] += answer["times"]
                    cpu[label] += answer["cpu"]
                    answers[label] = _deterministic(answer["result"])
        except subprocess.CalledProcessError:
            print(f"{case}: the base cannot run it (a later kind): skipped")
            continue
        print(f"{case}: wall {_ratio(times)}; CPU over its ranks {_ratio(cpu)}; {_agreement(answers)}")


def _ratio(samples: dict[str, list[float]], draws: int = 2000) -> str:
    """Both medians, their ratio (this / base) and its 90 % bootstrap interval: a run's time
    on 2 cores moves by half from one run to the next (ranks wait for a core, and a waiting
    gloo rank polls), so the ratio alone says little until the interval is narrow."""
    base, this = samples["base"], samples["this"]
    rng = random.Random(0)
    ratios = sorted(
        statistics.median(rng.choices(this, k=len(this))) / statistics.median(rng.choices(base, k=len(base)))
        for _ in range(draws)
    )
    low, high = ratios[draws // 20], ratios[-draws // 20]
    old, new = statistics.median(base), statistics.median(this)
    return f"base {old:.4f} s, this {new:.4f} s, ratio {new / old:.2f} [90 %: {low:.2f}-{high:.2f}]"


def _agreement(answers: dict[str, dict[str, Any]]) -> str:
    """Whether the deterministic fields both trees answer are equal, at every depth; a field only
    one tree has (a later revision's new field, at the top or inside a record such as a
    control's) is named apart with its values, and left out of the comparison."""
    differ: list[str] = []
    only: dict[str, list[str]] = {"base": [], "this": []}
    _walk(answers["base"], answers["this"], "", differ, only)
    shared = answers["base"].keys() & answers["this"].keys()
    verdict = f"all {len(shared)} shared fields equal"
    if differ:
        verdict = f"answers DIFFERENT in {', '.join(sorted(set(differ)))}"
    for label, paths in only.items():
        if paths:
            verdict += f"; only {label} has {', '.join(sorted(set(paths)))}"
    return verdict


def _walk(base: Any, this: Any, path: str, differ: list[str], only: dict[str, list[str]]) -> None:
    if isinstance(base, dict) and isinstance(this, dict):
        for key in base.keys() - this.keys():
            only["base"].append(f"{path}{key}={base[key]!r}")
        for key in this.keys() - base.keys():
            only["this"].append(f"{path}{key}={this[key]!r}")
        for key in base.keys() & this.keys():
            _walk(base[key], this[key], f"{path}{key}.", differ, only)
    elif isinstance(base, list) and isinstance(this, list) and len(base) == len(this):
        for b, t in zip(base, this, strict=True):
            _walk(b, t, f"{path}[].", differ, only)
    elif base != this:
        differ.append(path.rstrip(".") or "the answer")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="default: all")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--results", type=Path, help="write each case's result (no timings) here")
    parser.add_argument("--base", type=Path, help="a worktree of the revision to compare with")
    parser.add_argument("--rounds", type=int, default=3, help="with --base: turns per tree")
    parser.add_argument("--raw", type=Path, help=argparse.SUPPRESS)  # --base's child: one case's answer
    args = parser.parse_args()
    if args.base:
        compare(args.base.resolve(), args.case or list(CASES), args.runs, args.rounds)
        return 0
    if args.raw:
        answer = run_case(args.case[0], args.runs, False, 0)
        raw = {"times": answer["times"], "cpu": answer["cpu"], "result": answer["result"]}
        args.raw.write_text(json.dumps(raw))
        return 0
    import app

    print(f"app from {Path(app.__file__).parent}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    results = {}
    for name in args.case or list(CASES):
        answer = run_case(name, args.runs, args.profile, args.top)
        result = answer["result"]
        laps = {k: v for k, v in result["timings_s"].items() if k != "rank_total"}
        median = statistics.median(answer["times"])
        print(
            f"{name}: median {median:.4f} s (min {min(answer['times']):.4f}, max {max(answer['times']):.4f}) "
            f"over {args.runs}, CPU over its ranks {statistics.median(answer['cpu']):.4f} s; "
            f"passed {result['passed']}, rel_l2 {result['rel_l2']:.2e}, "
            f"controls {[c['name'] for c in result['controls']]}"
        )
        print(f"  rank 0 laps (last run): {laps}")
        if answer["profile"]:
            print(answer["profile"])
        results[name] = _deterministic(result)
    if args.results:
        args.results.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
