"""`package.module:attribute` names resolved to callables: the one dynamic import of the
worker. A registered check model's factory and its `parallelize`, and the rank server the
fork server starts, are all reached this way, so that nothing names them in an import.

`missing_module` finds a target's module without importing it: the web process, the CLI and
the rank program refuse a factory whose module is not there before any rank starts.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from typing import Any


class FactoryError(RuntimeError):
    """A registered factory that cannot be imported, fails, or returns the wrong things."""


def resolve(target: str) -> Callable[..., Any]:
    module_name, _, attribute = target.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as err:
        raise FactoryError(f"cannot import {target}: {type(err).__name__}: {err}") from err
    if not callable(found):
        raise FactoryError(f"{target} is not callable")
    factory: Callable[..., Any] = found
    return factory


def missing_module(target: str) -> str | None:
    """Why the module of `target` cannot be imported here because it is not there (`no module
    named 'mypkg'`), or None when import would find it. Nothing of it runs, not even its
    packages' `__init__`: that may import torch (never in the web process) or the operator's
    code, and finding a file needs neither. Errors inside a module that is there are the
    rank's to find, when it builds the model."""
    parts = target.partition(":")[0].split(".")
    locations: Sequence[str] | None = None  # the parent package's __path__; None: no package
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        if name in sys.modules:  # imported already (os.path, which os is not the package of)
            locations = getattr(sys.modules[name], "__path__", None)
            continue
        if depth > 1 and locations is None:
            parent = ".".join(parts[: depth - 1])
            return f"{parent!r} is a module, not a package: it has no {parts[depth - 1]!r}"
        spec = _find_spec(name, locations if depth > 1 else None)
        if spec is None:
            return f"no module named {name!r}"
        locations = spec.submodule_search_locations
    return None


def _find_spec(name: str, locations: Sequence[str] | None) -> ModuleSpec | None:
    """The spec import would use for `name`. A submodule is looked for as import does, in
    its parent's __path__ through each finder on sys.meta_path, because
    importlib.util.find_spec would import the parent package to get that path."""
    try:
        if locations is None:
            return importlib.util.find_spec(name)  # a top-level name: found, not imported
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec: ModuleSpec | None = find(name, locations) if find is not None else None
            if spec is not None:
                return spec
    except (ImportError, ValueError):
        return None
    return None
