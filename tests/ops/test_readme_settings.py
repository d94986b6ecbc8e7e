"""The Configuration table (docs/configuration.md, linked from the README's Configuration
section) lists every setting with its environment variable and default."""

from __future__ import annotations

import re
from pathlib import Path

from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "configuration.md"


def test_the_readme_links_the_table() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Configuration\n") :]
    assert "(docs/configuration.md)" in section[: section.index("\n## ", 1)]


def _rows() -> dict[str, str]:
    text = TABLE.read_text()
    section = text[text.index("# Configuration\n") :]
    section = section[: section.index("\n## ", 1)]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        if line.startswith("| `BATCHPLAN_"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            for variable in re.findall(r"`(BATCHPLAN_[A-Z_]+)`", cells[0]):
                rows[variable] = cells[1]
    return rows


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "unset"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_every_setting_is_in_the_table_with_its_default() -> None:
    rows = _rows()
    fields = {f"BATCHPLAN_{name.upper()}": field for name, field in Settings.model_fields.items()}
    assert sorted(fields) == sorted(rows), "the table and app/settings.py disagree"
    for variable, field in fields.items():
        default = field.get_default(call_default_factory=True)
        shown = "[]" if default == [] else _shown(default)
        assert f"`{shown}`" in rows[variable] or shown == "unset" == rows[variable], (variable, shown)
