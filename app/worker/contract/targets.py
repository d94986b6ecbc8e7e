"""`package.module:attribute` names resolved to callables: the one dynamic import of the
worker. A registered check model's factory and its `parallelize`, and the rank server the
fork server starts, are all reached this way, so that nothing names them in an import."""

from __future__ import annotations

import importlib
from collections.abc import Callable
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
