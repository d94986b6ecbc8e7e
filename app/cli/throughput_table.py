"""The plan table's lines about what was measured: the split's predicted times from throughput
curves (issue 38), and the lr rule an lr-scaling probe found best (issue 39); and the table of a
measured curve (`batchplan measure`)."""

from __future__ import annotations

import json

from app.client import Json


def _s(seconds: float) -> str:
    return f"{seconds:.4g} s"


def measured_lines(result: Json) -> list[str]:
    lines: list[str] = []
    t = result.get("throughput")
    if t:
        lines += [
            "",
            f"predicted from the curves: step {_s(t['predicted_step_s'])} "
            f"(micro-step {_s(t['predicted_micro_step_s'])}, idle {t['idle_fraction'] * 100:.3g}%); "
            f"even split {_s(t['even']['predicted_step_s'])}, by peak samples/s "
            f"{_s(t['proportional']['predicted_step_s'])}, largest micro-batches "
            f"{_s(t['fewest_accumulation']['predicted_step_s'])} "
            f"(accumulation {t['fewest_accumulation']['gradient_accumulation_steps']})",
        ]
        for g in result["replica_groups"]:
            lines.append(
                f"  dp ranks {g['start']}-{g['stop'] - 1} ({g['node_group']}): micro-batch "
                f"{g['micro_batch_size']} in {_s(g['predicted_micro_step_s'])}"
            )
    lr = result.get("learning_rate") or {}
    measured = lr.get("measured")
    if measured:
        check = f" (check {measured['check']})" if measured.get("check") else ""
        lines.append(f"lr rule {measured['best_rule']}: measured best by the lr-scaling probe{check}")
    return lines


def curve_lines(throughput: Json) -> list[str]:
    """A check's measured throughput (`batchplan measure`): a row per micro-batch, the fastest
    and the knee marked, then the curve as a plan request takes it."""
    fastest, knee = throughput["fastest_micro_batch_size"], throughput["knee_micro_batch_size"]
    step = (
        "forward, backward, optimizer step" if throughput["time_optimizer_step"] else "forward and backward"
    )
    lines = [
        f"one replica's micro-step ({step}) on {throughput['device']}, {throughput['threads']} thread(s), "
        f"measured by {throughput['measured_by']}: median of {throughput['repeats']} repeats after "
        f"{throughput['warmup_steps']} warm-up steps, spread = {throughput['spread_is']}",
        f"  {'micro':>6} {'step time':>11} {'spread':>7} {'samples/s':>11} {'tokens/s':>11} {'peak MiB':>9}",
    ]
    for p in throughput["points"]:
        b = p["micro_batch_size"]
        marks = ", ".join(m for m, at in (("fastest", fastest), ("knee", knee)) if at == b)
        if p.get("noisy"):
            marks = ", ".join(m for m in (marks, f"NOISY over {p['repeats']} repeats") if m)
        tokens = "-" if p["tokens_per_s"] is None else f"{p['tokens_per_s']:.4g}"
        peak = "-" if p["peak_memory_bytes"] is None else f"{p['peak_memory_bytes'] / 2**20:.1f}"
        lines.append(
            f"  {b:>6} {_s(p['step_time_s']):>11} {p['spread'] * 100:>6.1f}% {p['samples_per_s']:>11.5g} "
            f"{tokens:>11} {peak:>9}{'  <- ' + marks if marks else ''}"
        )
    if throughput.get("out_of_memory_at") is not None:
        lines.append(
            f"  micro-batch {throughput['out_of_memory_at']} ran out of device memory: larger not measured"
        )
    lines += [f"warning: {w}" for w in throughput.get("warnings") or []]
    lines += [
        f"fastest micro-batch {fastest}; knee {knee} (the smallest within {throughput['margin']:.0%} of the "
        f"fastest samples/s); measured in {throughput['seconds']:.3g} s",
        "as topology.throughput_curve (or --throughput-curve "
        + ",".join(f"{p['micro_batch_size']}:{p['samples_per_s']:g}" for p in throughput["curve"])
        + "):",
        "  " + json.dumps(throughput["curve"]),
    ]
    return lines
