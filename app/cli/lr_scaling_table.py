"""The lr-scaling probe's answer as `batchplan check --lr-scaling SAMPLES` prints it: one row a
run (the base run, then each rule's at the plan's global batch), then the verdict (its chart:
charts.py)."""

from __future__ import annotations

from app.client import Json


def _loss(value: float | None) -> str:
    return "diverged" if value is None else f"{value:.5g}"


def lr_scaling_lines(result: Json) -> list[str]:
    probe = result.get("lr_scaling")
    if not isinstance(probe, dict):
        return []
    base, G = probe["base"], probe["global_batch_size"]
    noise = probe["noise_scale"]
    start, end = noise.get("start"), noise.get("end")
    lines = [
        f"lr scaling over {probe['samples']:,} samples (held-out loss; a rule holds within "
        f"{probe['tolerance'] * 100:g} % of the base run):",
        f"  {'run':<8} {'batch':>8} {'lr':>10} {'final loss':>12} {'ratio':>8}  verdict",
        f"  {'base':<8} {base['batch_size']:>8,} {base['lr']:>10.4g} {_loss(base['curve'][-1]['loss']):>12}",
    ]
    for run in probe["rules"]:
        ratio = run["final_loss_ratio"]
        mark = "holds" if run["holds"] else "does NOT hold"
        if run["rule"] == probe["best_rule"]:
            mark += ", best"
        if run["rule"] == probe["plan_rule"]:
            mark += ", the plan's"
        lines.append(
            f"  {run['rule']:<8} {G:>8,} {run['lr']:>10.4g} {_loss(run['curve'][-1]['loss']):>12} "
            f"{'-' if ratio is None else f'{ratio:.4f}':>8}  {mark}"
        )
    shown = [f"{name} {value:,.4g}" for name, value in (("start", start), ("end", end)) if value is not None]
    lines.append(
        f"  noise scale B_simple: {', '.join(shown) or 'not measurable'}; regime "
        f"{probe['regime'].replace('_', ' ')}"
    )
    lines.append(f"verdict: {probe['verdict']}")
    return lines
