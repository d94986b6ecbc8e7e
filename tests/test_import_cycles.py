"""No import cycle anywhere in app/: every import counts, the deferred ones inside functions
too (a cycle hidden behind a deferred import is still a cycle), and app/core keeps few rooms at
its top. import-linter holds the core's floors and the siblings of the CLI and the check kinds;
this test holds the whole app, module by module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, known: set[str], source: str | None = None) -> set[str]:
    """The app modules `path` imports anywhere in its body, outside `if TYPE_CHECKING:` (names
    for mypy that never run); `from package import module` counts as the module."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text() if source is None else source)
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for child in node.body for n in ast.walk(child)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in APP.rglob("*.py")}
    known = set(files)
    return {name: imports_of(path, known) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_reads_the_app() -> None:
    graph = import_graph()
    assert len(graph) > 200
    assert "app.core.planner" in graph["app.api.plans"] or any(
        m.startswith("app.core.") for m in graph["app.api.plans"]
    )


def test_no_import_cycle_in_the_app() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles (cut each at its cause): " + "; ".join(" <-> ".join(c) for c in found)


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function() -> None:
    """The check must be able to fail: a deferred import that closes a loop is found."""
    a = APP / "core" / "records" / "record.py"
    deferred = "def f():\n    from app.core.planner import plan\n"
    graph = {"app.x": imports_of(a, {"app.core.planner"}, deferred) | {"app.y"}, "app.y": {"app.x"}}
    assert graph["app.x"] == {"app.core.planner", "app.y"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_core_has_few_rooms_at_its_top() -> None:
    """A newcomer finds a concept's room by its name: at most 12 entries in app/core."""
    entries = sorted(p.name for p in (APP / "core").iterdir() if p.name != "__pycache__")
    assert len(entries) <= 12, entries
