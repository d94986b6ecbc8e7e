"""Generated code reads like code written by hand: no template leftovers in the Python any
export writes (python, hf-trainer, lightning, accelerate's training script), for every documented
example plan and the golden test's plans. Two readers:

- ruff (the project's own linter, run on each file as its own tool): no undefined or unused
  names (pyflakes' F rules), no `== None` (E711, E712);
- the file's own syntax tree: no condition that is a constant (`range(90) if 90 else ...`,
  `if True:`), no multiplying or dividing by a literal 1 (`len(loader) // 1 * 1`).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from export_helpers import export_input
from test_exports_golden import PLANS

from app.core.exports.accelerate import CODE_END, CODE_START
from app.core.exports.parts.export_types import ExportInput, ExportUnsupported
from app.core.exports.registry import export
from app.schemas.examples import PLAN_EXAMPLES as EXAMPLES

PYTHON_FORMATS = ("python", "hf-trainer", "lightning", "accelerate")
BODIES: dict[str, tuple[dict[str, Any], Any]] = {
    **{f"example-{name}": (example["value"], None) for name, example in EXAMPLES.items()},
    **{f"golden-{name}": (body, options) for name, (body, options, _) in PLANS.items()},
}
RUFF = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))


def python_of(fmt: str, x: ExportInput) -> str | None:
    """The Python the export writes (accelerate's: the training script in its header)."""
    try:
        text = export(fmt, x).text
    except ExportUnsupported:
        return None
    if fmt != "accelerate":
        return text
    lines = text.splitlines()
    start, end = lines.index(f"# {CODE_START}"), lines.index(f"# {CODE_END}")
    return "\n".join(line[2:] if line.startswith("# ") else "" for line in lines[start + 1 : end]) + "\n"


def leftovers(source: str) -> list[str]:
    """What the syntax tree shows of a template: constant conditions, x1 arithmetic."""
    found = []
    for node in ast.walk(ast.parse(source)):
        test = getattr(node, "test", None) if isinstance(node, ast.If | ast.IfExp | ast.While) else None
        if isinstance(test, ast.Constant) and not isinstance(node, ast.While):
            found.append(f"line {node.lineno}: a constant condition: {ast.unparse(node)[:80]}")
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Mult | ast.FloorDiv | ast.Div)
            and any(isinstance(side, ast.Constant) and side.value == 1 for side in (node.left, node.right))
        ):
            found.append(f"line {node.lineno}: arithmetic by 1: {ast.unparse(node)}")
    return found


def _input(name: str) -> ExportInput:
    body, options = BODIES[name]
    planned = export_input(body)
    return ExportInput(planned.request, planned.plan, options) if options else planned


# Each plan with each format that writes it (the others refuse it, with a 422 of their own).
CASES = [(name, fmt) for name in BODIES for fmt in PYTHON_FORMATS if python_of(fmt, _input(name)) is not None]


@pytest.mark.parametrize(("name", "fmt"), CASES)
def test_the_python_an_export_writes_has_no_template_leftovers(name: str, fmt: str, tmp_path: Path) -> None:
    source = python_of(fmt, _input(name))
    assert source is not None
    assert not leftovers(source), leftovers(source)
    path = tmp_path / "export.py"
    path.write_text(source)
    checked = subprocess.run(
        [
            RUFF,
            "check",
            "--isolated",
            "--no-cache",
            "--select",
            "F,E711,E712",
            "--output-format",
            "concise",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
