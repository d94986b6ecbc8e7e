"""Python literals as the exports write them into generated code: `repr`, but strings in double
quotes, the way the rest of each file (and ruff's formatter) writes them, so that a value the
plan fills in reads like the code around it."""

from __future__ import annotations

import json
from typing import Any


def py_literal(value: Any) -> str:
    """Python source for `value` (None, bools, numbers, strings, and tuples, lists and dicts of
    them): a string as JSON writes it, whose escapes Python reads the same."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{py_literal(k)}: {py_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(py_literal(v) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(py_literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)
