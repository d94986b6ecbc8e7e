"""A stream plan's lines in `batchplan plan`'s printout: per run of ranks what each reads, and
the epoch after the end-of-epoch policy."""

from __future__ import annotations

from app.client import Json


def stream_lines(stream: Json | None) -> list[str]:
    """A stream plan's split: per run of ranks what each rank reads, then the epoch's totals."""
    if not stream:
        return []
    branch = f" ({stream['branch']} branch)" if stream["branch"] else ""
    lines = [
        "",
        f"stream {stream['splitter']}{branch}: {stream['num_shards']} shards over {stream['readers']} "
        f"readers, end_of_epoch {stream['end_of_epoch']}",
        f"{'dp ranks':>15}  {'shards':>7} {'samples':>9} {'micro-batches':>14} {'idle workers':>13}",
    ]
    for g in stream["rank_groups"]:
        ranks = f"{g['start']}-{g['stop'] - 1}"
        figures = f"{g['shards']:>7} {g['samples']:>9} {g['micro_batches']:>14} {g['idle_workers']:>13}"
        lines.append(f"{ranks:>15}  {figures}")
    advice = stream["suggested_num_shards"]
    lines.append(
        f"{stream['optimizer_steps_per_epoch']} optimizer steps per epoch, {stream['samples_trained']} "
        f"samples trained, {stream['duplicated_samples']} duplicated, {stream['dropped_samples']} dropped"
        + (f"; equal work at num_shards {', '.join(map(str, advice))}" if advice else "")
    )
    return lines
