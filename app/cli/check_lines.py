"""What each check kind adds to a finished check's printout (`output.show_check`), between its
first step's lines and the controls: one entry a kind, in the order they print."""

from __future__ import annotations

from collections.abc import Callable

from app.cli.lr_scaling_table import lr_scaling_lines
from app.cli.mesh_table import check_mesh_lines
from app.cli.run_table import run_lines
from app.client import Json

KIND_LINES: tuple[Callable[[Json], list[str]], ...] = (
    check_mesh_lines,  # the plan's mesh
    run_lines,  # steps above 1, and a resume within the run
    lr_scaling_lines,
)
