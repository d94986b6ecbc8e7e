"""The plan table's lines for a scaling law's recommendation (the answer's `recommendation`)."""

from __future__ import annotations

from app.client import Json


def law_lines(result: Json) -> list[str]:
    r = result.get("recommendation")
    if not r:
        return []
    lines = ["", f"{r['law']}: batch {r['batch_tokens']:.0f} tokens, peak lr {r['lr']:.4g}"]
    if r["planned_batch_tokens"] is not None:
        lines[-1] += (
            f"; nearest batch this cluster splits: {r['planned_batch_size']} sequences = "
            f"{r['planned_batch_tokens']} tokens ({r['planned_vs_law_percent']:+.2f}%)"
        )
    fit = "within the fitted ranges" if r["within_fit"] else "outside the fitted ranges (an extrapolation)"
    lines.append(f"the plan runs the {r['batch_from']}'s batch and the {r['lr_from']}'s lr; {fit}")
    for other in r["alternatives"]:
        if other["batch_tokens"] is None:
            lines.append(f"{other['law']}: no numbers ({other['unavailable']})")
        else:
            lines.append(
                f"{other['law']}: batch {other['batch_tokens']:.0f} tokens, peak lr {other['lr']:.4g}"
            )
    measured = r.get("measured")
    if measured:
        lines.append(
            f"measured critical batch {measured['critical_batch_tokens']:.0f} tokens ({measured['source']}): "
            f"the {measured['larger']}'s is the larger"
        )
    return lines
