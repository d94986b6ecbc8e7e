"""Waiting, with a deadline and a message that says what did not happen: for any condition,
for warm rank processes, for a check to reach a status. `client` is anything with httpx's
`get` (a TestClient or an httpx.Client on a real server)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from .bodies import lonely_rendezvous

T = TypeVar("T")
FINISHED = ("succeeded", "failed", "cancelled")
# What a server that is starting or gone answers with: not an answer yet.
NOT_ANSWERING = (OSError, httpx.TransportError)


def wait_for(
    predicate: Callable[[], T | None],
    what: str,
    timeout: float = 60,
    log: Path | None = None,
    *,
    interval: float = 0.05,
    proc: subprocess.Popen[bytes] | None = None,
) -> T:
    """The first truthy value of predicate(); connection errors count as not yet. With `proc`,
    fails as soon as that server exits; with `log`, failures show its end."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}:\n{_tail(log)}")
        with contextlib.suppress(*NOT_ANSWERING):
            if value := predicate():
                return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{_tail(log)}")
        time.sleep(interval)


def _tail(log: Path | None) -> str:
    return log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""


def wait_warm(
    client: httpx.Client,
    count: int,
    *,
    models: bool = False,
    timeout: float = 60,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> dict[str, Any]:
    """/v1/host once `count` ranks are warm and none is busy; with `models`, once every
    registered model was built or failed to (`loaded` not null)."""

    def warm() -> dict[str, Any] | None:
        host: dict[str, Any] = client.get("/v1/host").json()
        ready = host["warm_processes"] >= count and host["busy_processes"] == 0
        built = not models or all(m["loaded"] is not None for m in host["models"])
        return host if ready and built else None

    return wait_for(
        warm, f"{count} warm ranks{' and built models' if models else ''}", timeout, log, proc=proc
    )


def wait_check(
    client: httpx.Client,
    location: str,
    statuses: tuple[str, ...] = FINISHED,
    timeout: float = 60,
    interval: float = 0.02,
) -> dict[str, Any]:
    """The job at `location` once its status is one of `statuses`: for finished ones the
    server holds each answer until the check finishes (?wait=, up to a second at a time)."""
    last: dict[str, Any] = {}
    params = {"wait": min(1.0, timeout)} if set(statuses) <= set(FINISHED) else {}

    def reached() -> dict[str, Any] | None:
        nonlocal last
        last = client.get(location, params=params).json()
        return last if last["status"] in statuses else None

    try:
        return wait_for(reached, f"{location} to be {'/'.join(statuses)}", timeout, interval=interval)
    except AssertionError as err:
        raise AssertionError(f"{err}: {last}") from None


def run_check(client: httpx.Client, body: Any, timeout: float = 60) -> dict[str, Any]:
    """Submit a check (202, Location naming its id) and wait until it finished: the job."""
    response = client.post("/v1/checks", json=body)
    assert response.status_code == 202, response.text
    assert response.headers["location"] == f"/v1/checks/{response.json()['id']}"
    return wait_check(client, response.headers["location"], FINISHED, timeout)


def check_result(client: httpx.Client, body: Any, timeout: float = 120) -> dict[str, Any]:
    """Submit a check, wait until it finished, and the result of a check that ran."""
    job = run_check(client, body, timeout)
    assert job["status"] == "succeeded", job
    result: dict[str, Any] = job["result"]
    return result


def hold_ranks(client: httpx.Client, plan: Any, *, timeout: float = 60, **options: Any) -> str:
    """Submit a check whose second node never joins its rendezvous: it holds its ranks,
    running, until cancelled or timed out. Its location, once it runs."""
    body = {"plan": plan, "rendezvous": lonely_rendezvous(), **options}
    response = client.post("/v1/checks", json=body)
    assert response.status_code == 202, response.text
    location: str = response.headers["location"]
    wait_check(client, location, ("running",), timeout)
    return location
