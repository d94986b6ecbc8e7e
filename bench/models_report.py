"""bench_models.py's printed report: its three tables from the figures it measured (kept
apart so that the measuring script stays short)."""

from __future__ import annotations

from typing import Any

from _common import machine_line, table

REPLICAS = 4
MEMORY_BYTES = 4 * 1024 * 1024


def report(figures: dict[str, Any]) -> None:
    runs, checks = figures["runs"], figures["check_time"]
    print(machine_line())
    print(
        f"server: {REPLICAS} warm rank processes, warm after {figures['server_start_until_warm_s']:.1f} s; "
        f"bench total {figures['bench_s']:.1f} s"
    )
    print(f"\n1. check time, {REPLICAS} replicas, global 64, micro 8 (median of {runs} after 1 discarded)")
    labels = {
        "synthetic": "synthetic (baseline)",
        "mlp_noise0": "mlp, noise_scale steps 0",
        "mlp_noise8": "mlp, noise_scale steps 8",
        "gpt2_noise0": "gpt2 (transformers), steps 0",
        "gpt2_noise8": "gpt2 (transformers), steps 8",
    }
    rows = [
        [
            labels[name],
            f"{row['median_s']:.3f}",
            f"{row['min_s']:.3f}",
            f"{row['max_s']:.3f}",
            f"{row['vs_synthetic']:.2f}x",
            "-" if row["noise_scale_s"] is None else f"{row['noise_scale_s']:.3f}",
        ]
        for name, row in checks.items()
    ]
    print(table(["case", "median s", "min s", "max s", "vs synthetic", "noise_scale s"], rows))

    noise = figures["noise_accuracy"]
    print(
        f"\n2. noise scale of quadratic, global 128 on {REPLICAS} replicas, seeds 0..{noise['seeds'] - 1}; "
        f"truth (closed form per seed's dataset) {noise['truth_seed0']:.2f} at seed 0, "
        f"{noise['truth_min']:.2f}..{noise['truth_max']:.2f} over the seeds"
    )

    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    rows = [
        [
            steps,
            f"{row['estimates']}/{noise['seeds']}",
            f"{row['reliable']}/{noise['seeds']}",
            num(row["median_estimate"], ".2f"),
            num(row["mean_abs_rel_error"], ".1%"),
            num(row["median_relative_stderr"], ".1%"),
            f"{row['coverage_2se']:.0%}",
            f"{row['noise_scale_s']:.3f}",
        ]
        for steps, row in noise["by_steps"].items()
    ]
    headers = [
        "steps",
        "estimates",
        "reliable",
        "median B",
        "mean |err|/truth",
        "median rel stderr",
        "cover 2se",
    ]
    print(table([*headers, "noise s"], rows))

    search = figures["micro_batch_search"]
    found, scan = search["search"], search["linear_scan"]
    print(
        f"\n3. micro-batch search, wide_mlp, {MEMORY_BYTES} bytes (budget {search['budget_bytes']}), "
        f"global 512 on {REPLICAS} replicas (median seconds of {runs})"
    )
    rows = [
        [label, str(row["max_micro_batch_size"]), str(row["trials"]), f"{row['seconds']:.3f}"]
        for label, row in (("search (rank, over HTTP)", found), ("linear scan (in-process)", scan))
    ]
    print(table(["method", "max micro-batch", "trials", "seconds"], rows))
    micro = "/".join(str(m) for m in found["planned_micro_batch_sizes"])
    print(
        f"planned: micro-batch {micro} x {found['planned_accumulation']} accumulation steps; "
        f"same size found: {'yes' if search['same_size'] else 'NO'}; "
        f"linear/search: {search['trials_ratio']}x trials, {search['seconds_ratio']}x seconds"
    )
