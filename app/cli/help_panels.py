"""The groups `--help` lists options under, in a fixed order, written with click's plain formatter.

An option names its group with typer's `rich_help_panel=`; typer draws those panels only with
rich, which the CLI turns off (app/cli/__init__.py: rich's table cuts option names at 80
columns), so `PanelCommand` writes one plain click section per group instead.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand

CLUSTER = "Cluster"
BATCH = "Batch"
DATA = "Data"
LEARNING_RATE = "Learning rate"
CHECK = "Check"
PROBE = "Probe"
MEASURE = "Measure"
OUTPUT = "Output/Server"
OTHER = "Other"
ORDER = (CLUSTER, BATCH, DATA, LEARNING_RATE, CHECK, PROBE, MEASURE, OUTPUT, OTHER)


class PanelCommand(TyperCommand):
    """A command whose `--help` lists its options group by group (an option with none: Other)."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        groups: dict[str, list[tuple[str, str]]] = {name: [] for name in ORDER}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                groups.setdefault(getattr(param, "rich_help_panel", None) or OTHER, []).append(record)
        for name, records in groups.items():
            if records:
                with formatter.section(name):
                    formatter.write_dl(records)
