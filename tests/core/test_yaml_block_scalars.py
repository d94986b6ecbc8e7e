"""The kubernetes export's container scripts are YAML block scalars a person can read (issue 25),
and the script that runs is byte for byte what the double-quoted string said: both documents
are parsed with PyYAML and compared."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from export_helpers import export_input
from hypothesis import given
from hypothesis import strategies as st

from app.core.exports.parts import yaml_writer
from app.core.exports.parts.export_types import ExportInput, ExportOptions
from app.core.exports.parts.yaml_writer import to_yaml
from app.core.exports.registry import export
from app.schemas.examples import PLAN_EXAMPLES

# Lines as scripts have them, and what a block cannot hold: trailing and leading spaces, tabs,
# carriage returns, blank lines and characters beyond ASCII.
script_line = st.text(st.sampled_from([*"ab#:-|>'\"{}[]%@&*!?.$", " "]), max_size=12)
odd_line = st.text(st.sampled_from([*"ab#:-|", " ", "\t", "\r", "\u00e9", "\u2028"]), max_size=12)
multiline = st.builds(
    lambda lines, ends: "\n".join(lines) + "\n" * ends,
    st.lists(script_line | odd_line, min_size=2, max_size=6),
    st.integers(0, 2),
)


@given(multiline, st.integers(0, 3))
def test_multiline_text_reads_back_exactly_at_any_depth(text: str, depth: int) -> None:
    value: Any = text
    for level in range(depth):
        value = {"command": ["bash", "-c", value]} if level % 2 == 0 else [value, "x"]
    document = {"script": text, "nested": value}
    assert yaml.safe_load(to_yaml(document)) == document


@pytest.mark.parametrize(
    "text",
    [
        "set -euo pipefail\nexec torchrun train.py",
        "a: b\n- c\n---\n...\n# d\n|e\n>f",
        "first\n\n\n    indented\n\tafter a blank",
        "python - <<'EOF'\nprint(\"x\")\nEOF",
    ],
)
def test_scripts_are_written_as_blocks_and_read_back_exactly(text: str) -> None:
    written = to_yaml({"command": ["bash", "-c", text]})
    assert ("|-" in written) == ("\t" not in text)
    assert yaml.safe_load(written) == {"command": ["bash", "-c", text]}


def _quoted(monkeypatch: pytest.MonkeyPatch, x: ExportInput) -> str:
    """The same export with every string double-quoted, as before block scalars."""
    with monkeypatch.context() as patched:
        patched.setattr(yaml_writer, "_block", lambda text: None)
        return export("kubernetes", x).text


OPTIONS = [
    ExportOptions(),
    ExportOptions(preflight=False),
    ExportOptions(model_factory="app.worker.example_models:mlp", script="train/run.py"),
]
EVEN = [name for name in PLAN_EXAMPLES if not name.startswith("mixed")]  # mixed: uneven splits


@pytest.mark.parametrize("options", OPTIONS, ids=["preflight", "no-preflight", "model-factory"])
@pytest.mark.parametrize("name", EVEN)
def test_the_pytorchjob_scripts_are_block_scalars_that_run_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch, name: str, options: ExportOptions
) -> None:
    planned = export_input(PLAN_EXAMPLES[name]["value"])
    x = ExportInput(planned.request, planned.plan, options)
    text = export("kubernetes", x).text
    before = _quoted(monkeypatch, x)
    assert yaml.safe_load(text) == yaml.safe_load(before)
    for role in yaml.safe_load(text)["spec"]["pytorchReplicaSpecs"].values():
        [container] = role["template"]["spec"]["containers"]
        command = container["command"]
        if options.preflight:
            assert command[:2] == ["bash", "-c"] and command[2].count("\n") > 10
    if options.preflight:
        assert "\\x0a" in before and "\\x0a" not in text
        assert "- |-\n" in text and "set -euo pipefail\n" in text
