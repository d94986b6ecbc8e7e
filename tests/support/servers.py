"""A real `uvicorn app.main:app` in a subprocess on a free loopback port.

`running` starts any server command in its own session and always ends that session, so no
rank or fork server outlives a test; `serve` is the common case: this repository's app with
the caller's environment, live before the test sees it, with an HTTP client to talk to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.ports import free_port

from .polling import run_check, wait_for, wait_warm
from .processes import end_session

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[2]
QUIET = {"BATCHPLAN_LOG_FORMAT": "console", "BATCHPLAN_LOG_LEVEL": "warning"}

__all__ = [
    "HOST",
    "ROOT",
    "Server",
    "free_port",
    "request",
    "running",
    "serve",
    "server_argv",
    "stop",
    "wait_until_live",
    "worker_env",
]


def worker_env(db: Path, processes: int = 2, **settings: str) -> dict[str, str]:
    """A worker server's environment: its job database, its warm ranks, then `settings`
    (`check_timeout_s="120"` is BATCHPLAN_CHECK_TIMEOUT_S)."""
    env = {"BATCHPLAN_JOBS_DB": str(db), "BATCHPLAN_PROCESSES_PER_HOST": str(processes)}
    return env | {f"BATCHPLAN_{name.upper()}": value for name, value in settings.items()}


def server_argv(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "uvicorn", "app.main:app", "--host", HOST, "--port", str(port), *extra]


def stop(proc: subprocess.Popen[bytes], timeout: float = 15) -> int | None:
    """SIGTERM the server alone, so that it stops what it started itself (as `kill PID` does);
    SIGKILL after `timeout`. Its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode


@contextlib.contextmanager
def running(
    argv: list[str], env: Mapping[str, str], cwd: Path, log: Path | None
) -> Iterator[subprocess.Popen[bytes]]:
    """Start `argv` in its own session with exactly `env`, output to `log` (or nowhere);
    always stop it and end whatever of its session is left."""
    with contextlib.ExitStack() as files:
        out = files.enter_context(log.open("wb")) if log is not None else subprocess.DEVNULL
        proc = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        stop(proc)
        end_session(proc.pid)


def wait_until_live(
    proc: subprocess.Popen[bytes], port: int, log: Path | None = None, limit_s: float = 30.0
) -> None:
    def live() -> bool:
        return request(port, "GET", "/livez", timeout=1.0)[0] == 200

    wait_for(live, "/livez", limit_s, log, interval=0.05, proc=proc)


def request(
    port: int,
    method: str,
    path: str,
    body: Any = None,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: float = 5.0,
) -> tuple[int, dict[str, str], Any]:
    """One request to the server on `port`: (status, headers, the JSON body or None)."""
    response = httpx.request(
        method, f"http://{HOST}:{port}{path}", json=body, headers=dict(headers or {}), timeout=timeout
    )
    return response.status_code, dict(response.headers), json.loads(response.content or b"null")


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    log: Path | None
    api_key: str | None = None
    client: httpx.Client = field(init=False)  # on the server's URL, with the API key when there is one

    def __post_init__(self) -> None:
        auth = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self.client = httpx.Client(base_url=self.url, headers=auth, timeout=30)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def wait_warm(self, count: int, *, models: bool = False, timeout: float = 90) -> dict[str, Any]:
        return wait_warm(self.client, count, models=models, timeout=timeout, proc=self.process, log=self.log)

    def job(self, job_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.client.get(f"/v1/checks/{job_id}").json()
        return found

    def check(self, body: Any, timeout: float = 60) -> dict[str, Any]:
        return run_check(self.client, body, timeout)

    def stop(self) -> int | None:
        self.client.close()
        return stop(self.process)


@contextlib.contextmanager
def serve(
    env: Mapping[str, str], log: Path | None = None, *, limit_s: float = 30, live: bool = True
) -> Iterator[Server]:
    """This repository's app on a free loopback port, with this process's environment, quiet
    logs and then `env`; yielded once /livez answers (at once with live=False, for a caller
    that starts several and then waits for each), then stopped with its whole session."""
    port = free_port()
    with running(server_argv(port), {**os.environ, **QUIET, **env}, ROOT, log) as proc:
        server = Server(proc, port, log, env.get("BATCHPLAN_API_KEY"))
        try:
            if live:
                wait_until_live(proc, port, log, limit_s)
            yield server
        finally:
            server.client.close()
