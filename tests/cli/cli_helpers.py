"""Shared by the CLI tests (conftest.py holds the fixtures)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[2]
API_KEY = "cli-test-key"


@dataclass
class Server:
    url: str
    log: Path
    api_key: str | None = None


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


Invoke = Callable[..., Run]
