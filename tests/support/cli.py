"""What the CLI tests' fixtures (tests/cli/conftest.py) hand the tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

API_KEY = "cli-test-key"  # the key the `worker_server` fixture requires


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str


Invoke = Callable[..., Run]
