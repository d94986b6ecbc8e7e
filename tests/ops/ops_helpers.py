"""Helpers for the ops tests: read the Dockerfile, run a server on a free loopback port, always stop it."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
VENV_BIN = Path(sys.executable).parent
HOST = "127.0.0.1"


# ------------------------------------------------------------------ Dockerfile


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (KEYWORD, arguments)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str:
        found = self.all(keyword)
        assert found, f"the stage has no {keyword}"
        return found[-1]

    def env(self) -> dict[str, str]:
        """The stage's ENV settings (`K=V ...` or `K V`), `$VAR` / `${VAR}` left as written."""
        out: dict[str, str] = {}
        for args in self.all("ENV"):
            words = shlex.split(args)
            if words and "=" not in words[0]:
                out[words[0]] = " ".join(words[1:])
                continue
            for word in words:
                key, _, value = word.partition("=")
                out[key] = value
        return out


def logical_lines(text: str) -> list[str]:
    """Instructions with their `\\` continuations joined; comments and blank lines dropped."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1].strip() + " "
            continue
        lines.append((current + stripped).strip())
        current = ""
    if current:
        lines.append(current.strip())
    return lines


def parse_dockerfile(path: Path = DOCKERFILE) -> tuple[list[tuple[str, str]], list[Stage]]:
    """(global instructions before the first FROM, the stages in order)."""
    preamble: list[tuple[str, str]] = []
    stages: list[Stage] = []
    for line in logical_lines(path.read_text()):
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif stages:
            stages[-1].instructions.append((keyword, args.strip()))
        else:
            preamble.append((keyword, args.strip()))
    return preamble, stages


def exec_form(args: str) -> list[str]:
    """An exec-form (JSON array) argument list; anything else fails the test."""
    value = json.loads(args)
    assert isinstance(value, list) and value and all(isinstance(v, str) for v in value), args
    return value


def final_cmd() -> list[str]:
    return exec_form(parse_dockerfile()[1][-1].last("CMD"))


def healthcheck_cmd() -> tuple[dict[str, str], list[str]]:
    """The final stage's HEALTHCHECK: its options and its exec-form command."""
    args = parse_dockerfile()[1][-1].last("HEALTHCHECK")
    head, sep, command = args.partition("CMD ")
    assert sep, f"HEALTHCHECK without CMD: {args}"
    options = dict(opt.lstrip("-").split("=", 1) for opt in head.split())
    return options, exec_form(command)


def image_env(data_dir: Path) -> dict[str, str]:
    """The environment the image's final stage gives its process, mapped onto this machine:
    the venv's bin first on PATH (the image's /opt/venv/bin), /data moved to `data_dir`."""
    env = dict(os.environ)
    for key, value in parse_dockerfile()[1][-1].env().items():
        env[key] = str(data_dir) + value.removeprefix("/data") if value.startswith("/data/") else value
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    return env


# ------------------------------------------------------------------ servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def http_get(url: str, headers: dict[str, str] | None = None, timeout: float = 2.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def stop(proc: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM the process group (the server and anything it started), SIGKILL after 10 s."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return proc.returncode


@contextlib.contextmanager
def running(argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Start `argv` in its own session (so the whole group can be stopped), always stop it."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield proc
        finally:
            stop(proc)


def wait_until_live(proc: subprocess.Popen[bytes], port: int, log: Path, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            if http_get(f"http://{HOST}:{port}/livez", timeout=1.0)[0] == 200:
                return
        time.sleep(0.1)
    raise AssertionError(f"/livez did not answer within {limit_s:.0f} s:\n{log.read_text()[-3000:]}")


def uvicorn_argv(port: int) -> list[str]:
    """The image's CMD, on loopback and a free port instead of 0.0.0.0:8000."""
    argv = final_cmd()
    for flag, value in (("--host", HOST), ("--port", str(port))):
        assert flag in argv, f"the CMD has no {flag}: {argv}"
        argv[argv.index(flag) + 1] = value
    return argv
