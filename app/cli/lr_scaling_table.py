"""The lr-scaling probe's answer as `batchplan check --lr-scaling SAMPLES` prints it: one row a
run (the base run, then each rule's at the plan's global batch), then the verdict."""

from __future__ import annotations

from pathlib import Path

import typer

from app.cli.run_table import chart_format
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


def save_lr_chart(done: Json, path: Path, url: str | None, api_key: str | None) -> None:
    """The probe's chart, from the server that ran it or drawn here."""
    from app.cli.compute import make_client  # they import this module (output.show_check)
    from app.cli.output import client_errors, fail

    result = done.get("result")
    probe = result.get("lr_scaling") if isinstance(result, dict) else None
    if not probe:
        fail({"detail": f"no chart written to {path}: the check ran no lr-scaling probe (give --lr-scaling)"})
    fmt = chart_format(path)
    if url:
        with client_errors(), make_client(url, api_key) as client:
            image = client.check_lr_scaling(str(done["id"]), fmt)
    else:
        from app.charts import lr_scaling_chart

        image = lr_scaling_chart(
            probe, fmt, f"lr scaling to a global batch of {probe['global_batch_size']:,}"
        )
    try:
        path.write_bytes(image)
    except OSError as err:
        fail({"detail": f"cannot write {path}: {err.strerror or err}"})
    typer.echo(f"wrote {path}", err=True)
