"""docs/architecture.md's table "The path of POST /v1/checks" against the code: every function it
names is where it says, the count under it is its number of rows, and nothing on a pipe between
the pool and its ranks is pickled (the codec's bytes go as they are)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"


def _table() -> tuple[list[str], str]:
    text = PAGE.read_text().split("## The path of `POST /v1/checks`", 1)[1]
    rows = [line for line in text.splitlines() if re.match(r"\| \d+ \|", line)]
    return rows, text


STANDARD = {"json", "Connection"}  # the standard library's: json.dumps, Connection.send_bytes


def _defines(tree: ast.AST, name: str) -> bool:
    return any(
        isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name for n in ast.walk(tree)
    )


def _exists(owner: str, name: str) -> bool:
    """`owner.name`: a module of app/ (`store.create`, `json_body.py`) or a class in one
    (`CheckRequestIn.to_core`) that defines `name`."""
    if name == "py":
        return any((ROOT / "app").rglob(f"{owner}.py"))
    for path in (ROOT / "app").rglob("*.py"):
        tree = ast.parse(path.read_text())
        if path.stem == owner and _defines(tree, name):
            return True
        classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == owner]
        if any(_defines(c, name) for c in classes):
            return True
    return False


def test_every_function_the_table_names_exists_and_the_count_is_its_rows() -> None:
    rows, text = _table()
    assert [int(row.split("|")[1]) for row in rows] == list(range(1, len(rows) + 1))
    named = set()
    for row in rows:
        for token in re.findall(r"`([\w./()]+)`", row.split("|")[2]):
            parts = re.split(r"[./]", token.removesuffix("()"))
            if len(parts) >= 2:
                named.add((parts[-2], parts[-1]))
    assert len(named) >= 8
    missing = [f"{a}.{b}" for a, b in sorted(named) if a not in STANDARD and not _exists(a, b)]
    assert not missing, f"docs/architecture.md names what the code does not have: {missing}"
    counts = re.search(r"\*\*(\d+) on one host, (\d+) across hosts\.\*\*", text)
    assert counts is not None
    assert int(counts[1]) == len(rows) and int(counts[2]) == len(rows) + 4


def test_the_pipe_to_the_ranks_carries_bytes_never_pickles() -> None:
    for path in (
        ROOT / "app" / "worker" / "service" / "rank_process.py",
        ROOT / "app" / "worker" / "rank" / "rank_server.py",
    ):
        calls = {
            n.func.attr
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        }
        assert {"send_bytes", "recv_bytes"} <= calls, path
        assert not calls & {"send", "recv"}, f"{path.name} pickles on its pipe: {calls & {'send', 'recv'}}"
