"""A fresh clone runs every test (issue 40): no test reads a file from beside the repository,
as the Compose test once read its JSON schema from the `shared/schemas/` folder beside it.
What the tests need is vendored under tests/ with its source and licence
(tests/ops/schemas/README.md)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = sorted((ROOT / "tests").rglob("*.py"))

# Ways out of the repository: above its root by name, a relative climb, an absolute path.
OUTSIDE = [
    re.compile(r"\bROOT\.parent\b"),
    re.compile(r"""Path\(\s*["']\.\."""),
    re.compile(r"""(?:Path|open)\([^)]*\.\./"""),
    re.compile(r"""["']/work/"""),
    re.compile(r"""/\s*["']shared["']"""),
]


def test_no_test_reaches_outside_the_repository() -> None:
    found = []
    for path in TESTS:
        text = path.read_text()
        for pattern in OUTSIDE:
            found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in pattern.finditer(text)]
        depth = len(path.relative_to(ROOT).parts) - 1  # parents[depth] is the root
        for match in re.finditer(r"parents\[(\d+)\]", text):
            if int(match.group(1)) > depth:
                found.append(f"{path.relative_to(ROOT)}: {match.group(0)} climbs above the root")
    assert found == []


def test_the_vendored_compose_schema_is_there_with_its_source_and_licence() -> None:
    schemas = ROOT / "tests" / "ops" / "schemas"
    assert (schemas / "compose-spec.json").is_file()
    readme = (schemas / "README.md").read_text()
    assert "compose-spec/compose-spec" in readme and "Apache License 2.0" in readme
    assert "Apache License" in (schemas / "LICENSE-Apache-2.0.txt").read_text()
