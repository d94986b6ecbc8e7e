"""How the suite runs on several pytest-xdist workers (`pytest -n 3`: `--dist loadgroup` is in
pyproject.toml's addopts); a pytest plugin that tests/conftest.py loads, not a test module.

A fixture of module or session scope is set up once per worker process that needs it, so a
warm rank pool, a server or the Slurm cluster would start once on each worker that ran one of
its tests. Here every test that uses such a fixture of the suite's own (from a conftest or a
test module; directly or through another fixture) is put in one unit with every other test
that uses it, transitively, and with the tests that carry the same
`@pytest.mark.xdist_group("name")`: a unit runs on one worker, in collection order, and its
shared fixtures start once. The other tests go one by one to whichever worker is free. Units
holding a `slow` test are handed out first, so that the run does not end waiting on one long
test that started last.

(xdist's own loadgroup reads the marks by rewriting node ids, which pytest 9.2 no longer lets
it do: pytest-xdist issue 1386. So the workers, which collect, write the units to a file the
controller's scheduler reads.)

What a test must do to be safe on any worker, beside any other test:
- ports from `app.ports.free_port()`, handed at once to what binds them; never a fixed port;
- files under `tmp_path` / `tmp_path_factory` (per worker under xdist), never a fixed path;
- the environment through `monkeypatch.setenv`, never `os.environ` itself; a process group
  (`dist.init_process_group`) destroyed by the test or fixture that made it;
- what must never run twice at once on this host, even from two test runs (the Slurm
  cluster), takes a lock of its own (tests/slurm/slurm_cluster.py);
- tests that share something that is no fixture (a file both write, say) carry one
  `@pytest.mark.xdist_group("name")`.
Without `-n` (one file while working on it: `pytest tests/api/test_x.py`) nothing here runs.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

SHARED_SCOPES = {"module", "package", "session"}
# The tests that import transformers' Trainer or Lightning into the worker process itself (about
# 5 CPU-s each over torch, once per worker that imports it): one worker runs them all.
IN_PROCESS_TRAINERS = pytest.mark.xdist_group("in_process_trainers")
UNITS_FILE = "batchplan_units"  # the key in xdist's workerinput: where the units are written
UNIT = pytest.StashKey[str]()
_UNITS_PATH = pytest.StashKey[Path]()


def _defined_in(fixturedef: pytest.FixtureDef[object], root: Path) -> Path | None:
    """The suite's file (a conftest, a test module) that defines the fixture; None for pytest's
    own (tmp_path_factory) and installed plugins' fixtures, which are not the suite's to share."""
    try:
        where = Path(inspect.getfile(fixturedef.func)).resolve()
    except TypeError:
        return None
    if not where.is_relative_to(root) or "site-packages" in where.parts:
        return None
    return where.relative_to(root)


def _shared_fixtures(item: pytest.Item) -> list[str]:
    """The module/session fixtures of the suite's own that `item` sets up, directly or not."""
    info = getattr(item, "_fixtureinfo", None)
    found = []
    for name in getattr(item, "fixturenames", ()):
        defs = info.name2fixturedefs.get(name) if info is not None else None
        if not defs:
            continue
        used = defs[-1]  # the closest definition overrides the others
        if used.scope in SHARED_SCOPES and (where := _defined_in(used, item.config.rootpath)) is not None:
            found.append(f"{where.as_posix()}::{name}")
    return found


def _marked_groups(item: pytest.Item) -> list[str]:
    return [
        f"group:{m.args[0] if m.args else m.kwargs.get('name', 'default')}"
        for m in item.iter_markers("xdist_group")
    ]


class _Units:
    """Union-find over shared fixtures and group names: the smallest key names the unit."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, key: str) -> str:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def join(self, keys: Iterable[str]) -> None:
        first, *others = keys
        for other in others:
            a, b = self.find(first), self.find(other)
            if a != b:
                self.parent[max(a, b)] = min(a, b)


def _is_worker(config: pytest.Config) -> bool:
    return UNITS_FILE in getattr(config, "workerinput", {})


# ----------------------------------------------------------------------------- on each worker


@pytest.hookimpl(trylast=True)  # after any other plugin reorders or deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _is_worker(config):
        return
    units = _Units()
    keys = {}
    for item in items:
        keys[item] = _shared_fixtures(item) + _marked_groups(item)
        if keys[item]:
            units.join(keys[item])
    slow_units = set()
    for item in items:
        item.stash[UNIT] = units.find(keys[item][0]) if keys[item] else item.nodeid
        if item.get_closest_marker("slow") is not None:
            slow_units.add(item.stash[UNIT])
    # Every worker collects the same and sorts the same: the controller checks the collections
    # are equal. Stable, so a unit keeps its tests' order and a module its fixtures' order.
    items.sort(key=lambda item: item.stash[UNIT] not in slow_units)


@pytest.hookimpl(tryfirst=True)  # before xdist sends the collection to the controller
def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    if not _is_worker(config):
        return
    units = {item.nodeid: item.stash[UNIT] for item in session.items if item.stash[UNIT] != item.nodeid}
    target = Path(config.workerinput[UNITS_FILE])  # type: ignore[attr-defined]
    mine = target.with_name(f"{target.name}.{config.workerinput['workerid']}")  # type: ignore[attr-defined]
    mine.write_text(json.dumps(units))
    os.replace(mine, target)  # every worker writes the same units; a reader sees one whole file


# ----------------------------------------------------------------------------- on the controller


def pytest_configure(config: pytest.Config) -> None:
    # `tx` lists the workers to start: empty without -n (and on a worker, where dist is "no").
    if (
        config.pluginmanager.hasplugin("xdist")
        and config.getoption("dist") == "loadgroup"
        and config.getoption("tx")
    ):
        folder = Path(tempfile.mkdtemp(prefix="batchplan-xdist-"))
        config.stash[_UNITS_PATH] = folder / "units.json"


def pytest_unconfigure(config: pytest.Config) -> None:
    if (path := config.stash.get(_UNITS_PATH, None)) is not None:
        shutil.rmtree(path.parent, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    if (path := node.config.stash.get(_UNITS_PATH, None)) is not None:
        node.workerinput[UNITS_FILE] = str(path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if _UNITS_PATH not in config.stash:
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's scope scheduling with our units as the scopes, in the workers' order."""

        units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:  # first asked once every worker has sent its collection
                self.units = json.loads(config.stash[_UNITS_PATH].read_text())
            return self.units.get(nodeid, nodeid)

    config.option.loadscopereorder = False  # keep the workers' order: slow units first
    return UnitScheduling(config, log)
