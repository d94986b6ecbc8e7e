"""Skip marks for optional packages, decided without importing them.

`pytest.importorskip("torch")` at a module's top imports torch in every pytest-xdist worker
as it collects (3 CPU-s each), though the tests that use the package run on one worker, and
most of them only in the processes they start. `find_spec` looks the package up and runs none
of it.
"""

from __future__ import annotations

import importlib.util

import pytest

__all__ = ["installed"]


def installed(package: str) -> pytest.MarkDecorator:
    """Skip where `package` is not installed: `pytestmark = [installed("torch")]`."""
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=f"{package} is not installed")
