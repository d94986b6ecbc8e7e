"""What the CLI tests' fixtures (tests/cli/conftest.py) hand the tests, and `both`: one command
run here and against a real server."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from support.servers import Server

API_KEY = "cli-test-key"  # the key the `worker_server` fixture requires


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str


Invoke = Callable[..., Run]


def on(server: Server) -> list[str]:
    """The flags that send a command to `server` (the `worker_server` fixture's key)."""
    return ["--url", server.url, "--api-key", API_KEY]


def both(run: Invoke, server: Server, *args: str) -> tuple[Run, Run]:
    """The command computed here, then by the server (--url)."""
    local = run(*args)
    remote = run(*args, "--url", server.url)
    return local, remote
