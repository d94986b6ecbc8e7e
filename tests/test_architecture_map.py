"""docs/architecture.md's map of the packages is held to the tree: every module of app/ is
named in it, and every module it names exists (a renamed or removed module fails here)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"


def map_text() -> str:
    page = (ROOT / "docs" / "architecture.md").read_text()
    start = page.index("## Packages")
    return page[start : page.index("\n## ", start + 1)]


def named() -> set[str]:
    """Every `name.py` the map gives, with the folders it writes before it (`contract/kinds/run.py`)."""
    return {n.lstrip("/") for n in re.findall(r"[\w/]*\w+\.py\b", map_text())}


def modules() -> list[Path]:
    return sorted(p.relative_to(APP) for p in APP.rglob("*.py") if p.name != "__init__.py")


def is_named(module: Path, names: set[str], text: str) -> bool:
    """Named as its path from any folder down (`kinds/run.py`), or by its file name alone where the
    map lists it under its folder's heading (`run.py` below `kinds/`)."""
    parts = module.parts
    if any("/".join(parts[i:]) in names for i in range(len(parts))):
        return True
    return _under_its_folder(module, text)


def _under_its_folder(module: Path, text: str) -> bool:
    """The map is a tree: a folder's line (`  kinds/`) and below it, indented deeper, its files."""
    lines = text.splitlines()
    folders = list(module.parts[:-1])
    depth_of_folder = None
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if (
            folders
            and stripped.startswith(folders[-1] + "/")
            and (stripped == folders[-1] + "/" or stripped[len(folders[-1]) + 1 :].startswith(" "))
        ):
            depth_of_folder = indent
            continue
        if depth_of_folder is not None:
            if stripped and indent <= depth_of_folder and not stripped.startswith(("(", "`")):
                depth_of_folder = None
                continue
            if re.search(rf"(?<![\w/]){re.escape(module.name)}\b", line):
                return True
    return False


def test_the_map_reads_the_tree() -> None:
    assert len(modules()) > 150
    assert len(named()) > 100


def test_every_module_is_on_the_map() -> None:
    names, text = named(), map_text()
    missing = [str(m) for m in modules() if not is_named(m, names, text)]
    assert missing == [], "name these in docs/architecture.md's map: " + ", ".join(missing)


def test_the_map_names_no_module_that_is_gone() -> None:
    paths = {str(m) for m in modules()} | {str(p.relative_to(APP)) for p in APP.rglob("__init__.py")}
    gone = [
        n
        for n in sorted(named())
        if not (n.startswith(("tests/", "bench/")) and (ROOT / n).exists())
        and not any(p == n or p.endswith("/" + n) for p in paths)
    ]
    assert gone == [], "the map names modules the tree does not have: " + ", ".join(gone)
