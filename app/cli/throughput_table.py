"""The plan table's lines about what was measured: the split's predicted times from throughput
curves (issue 38), and the lr rule an lr-scaling probe found best (issue 39)."""

from __future__ import annotations

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
