"""The lr-scaling probe's answer as `batchplan check --lr-scaling SAMPLES` prints it: one row a
run (the base run, then each rule's at the plan's global batch), then the verdict (its chart:
charts.py)."""

from __future__ import annotations

from app.client import Json


def _loss(value: float | None) -> str:
    return "diverged" if value is None else f"{value:.5g}"


def _tolerance(probe: Json) -> str:
    if probe.get("tolerance_unit") == "nats":
        return f"{probe['tolerance']:g} nats"
    return f"{probe['tolerance'] * 100:g} %"


def _mark(run: Json) -> str:
    outcome = run.get("outcome", "holds" if run["holds"] else "fails")
    spread = run.get("ratio_spread")
    words = {"holds": "holds", "fails": "does NOT hold", "borderline": "borderline (seeds disagree)"}[outcome]
    if spread:
        words += f", spread {spread:.3f}"
    if run.get("still_falling"):
        words += ", still falling"
    return words


def lr_scaling_lines(result: Json) -> list[str]:
    probe = result.get("lr_scaling")
    if not isinstance(probe, dict):
        return []
    base, G = probe["base"], probe["global_batch_size"]
    noise = probe["noise_scale"]
    start, end = noise.get("start"), noise.get("end")
    metric = probe.get("metric_name")
    judge = (
        "held-out loss" if metric is None else f"judged by the factory's {metric}, held-out loss beside it"
    )
    lines = [
        f"lr scaling over {probe['samples']:,} samples, {probe.get('seeds', 1)} seed(s) ({judge}; a "
        f"rule holds within {_tolerance(probe)} of the base run in every seed; ratio: the seeds' mean):",
        f"  {'run':<8} {'batch':>8} {'lr':>10} {'final loss':>12} {'ratio':>8}  verdict",
        f"  {'base':<8} {base['batch_size']:>8,} {base['lr']:>10.4g} {_loss(base['curve'][-1]['loss']):>12}",
    ]
    for run in probe["rules"]:
        ratio = run["final_loss_ratio"]
        mark = _mark(run)
        if run.get("metric") is not None:
            mark = f"{metric} {run['metric']:.4g} (base {_loss(base.get('metric'))}): {mark}"
        if run["rule"] in probe.get("tied_for_best", ())[1:]:
            mark += ", tied for best"
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
