"""One uvicorn worker on loopback and the two load generators that drive it (bench_http,
bench_load and profile_http share them).

Endpoints: `livez` (GET /livez, the server's floor), `plans` (POST /v1/plans with varied
README bodies) and `mixed` (POST /v1/plans with varied mixed-cluster bodies). Each plan
connection cycles through its own order of bodies, so consecutive requests differ.

Load generator: `wrk` when it is on PATH (C, cheapest; a Lua script cycles the bodies), else a
lean asyncio raw-socket HTTP/1.1 keep-alive client (stdlib only).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import ROOT, quantile
from plan_bodies import varied_bodies

HOST = "127.0.0.1"
PATHS = {"livez": "/livez", "plans": "/v1/plans", "mixed": "/v1/plans"}
ENDPOINT_NAMES = tuple(PATHS)


@dataclass
class Phase:
    endpoint: str
    seconds: float
    requests: int = 0
    errors: int = 0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    latencies: list[float] = field(default_factory=list)  # seconds (asyncio generator only)
    server_cpu_s: float = float("nan")

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def cpu_us_per_request(self) -> float:
        return self.server_cpu_s / self.requests * 1e6 if self.requests else float("nan")


# ----------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_server(port: int, cpu: int | None, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """uvicorn app.main:app, one worker, the check worker off; `env` adds settings."""
    env = dict(os.environ, BATCHPLAN_WORKER_ENABLED="false", PYTHONUNBUFFERED="1", **(env or {}))
    env.setdefault("BATCHPLAN_JOBS_DB", str(Path(tempfile.gettempdir()) / f"bench-jobs-{port}.sqlite3"))
    cmd = [sys.executable, "-m", "uvicorn", "app.main:app", "--host", HOST, "--port", str(port)]
    cmd += ["--workers", "1", "--log-level", "warning"]
    if cpu is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", str(cpu), *cmd]
    # The server logs every request (access lines, as deployed); they go to a file, not
    # into the figures.
    log = open(server_log(port), "wb")  # noqa: SIM115
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT
    )


def server_log(port: int) -> Path:
    """Where the server on `port` writes its log (access lines included)."""
    return Path(tempfile.gettempdir()) / f"bench-server-{port}.log"


def stop_server(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: only the server and its children
        proc.wait(timeout=5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass


def raw_request(port: int, data: bytes, timeout: float = 2.0) -> tuple[int, bytes]:
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(data)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        head, _, first = buf.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        length = int(m.group(1)) if m else 0
        body = bytearray(first)  # grows in place: a 10 MB answer is not copied per chunk
        while len(body) < length:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            body += chunk
        return status, bytes(body)


def wait_ready(port: int, proc: subprocess.Popen[bytes], limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    request = build_request("livez", port, close=True)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"uvicorn exited with {proc.returncode} before serving /livez")
        try:
            if raw_request(port, request)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"/livez did not answer within {limit_s:.0f} s")


def server_cpu_seconds(pid: int) -> float:
    """utime + stime of the server process (Linux /proc); NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


# ------------------------------------------------------------------ requests


def bodies(endpoint: str) -> list[bytes]:
    """The JSON bodies `endpoint` cycles through (none for livez)."""
    if endpoint == "livez":
        return []
    return [json.dumps(b, separators=(",", ":")).encode() for b in varied_bodies(endpoint)]


def _http(endpoint: str, port: int, body: bytes | None, close: bool) -> bytes:
    conn = b"close" if close else b"keep-alive"
    head = f"Host: {HOST}:{port}\r\n".encode() + b"Connection: " + conn + b"\r\n"
    if body is None:
        return b"GET " + PATHS[endpoint].encode() + b" HTTP/1.1\r\n" + head + b"\r\n"
    return (
        b"POST " + PATHS[endpoint].encode() + b" HTTP/1.1\r\n" + head
        + b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
        + b"\r\n\r\n" + body
    )  # fmt: skip


def build_requests(endpoint: str, port: int, close: bool = False) -> list[bytes]:
    """Every request `endpoint` sends, in order (one for livez)."""
    payloads = bodies(endpoint)
    if not payloads:
        return [_http(endpoint, port, None, close)]
    return [_http(endpoint, port, body, close) for body in payloads]


def build_request(endpoint: str, port: int, close: bool = False) -> bytes:
    return build_requests(endpoint, port, close)[0]


# ------------------------------------------------------- generator: asyncio

_CL = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")


async def _client(port: int, requests: list[bytes], offset: int, stop_at: float, phase: Phase) -> None:
    reader, writer = await asyncio.open_connection(HOST, port)
    perf = time.perf_counter
    lat = phase.latencies
    n = len(requests)
    i = offset
    try:
        while perf() < stop_at:
            t0 = perf()
            writer.write(requests[i % n])
            i += 1
            head = await reader.readuntil(b"\r\n\r\n")
            m = _CL.search(head)
            if m:
                await reader.readexactly(int(m.group(1)))
            lat.append(perf() - t0)
            phase.requests += 1
            if head[9:12] != b"200":
                phase.errors += 1
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        phase.errors += 1
    finally:
        writer.close()


async def _drive(port: int, requests: list[bytes], connections: int, seconds: float, phase: Phase) -> None:
    started = time.perf_counter()
    stop_at = started + seconds
    # Connections start at different bodies: the server never sees a run of equal requests.
    step = max(1, len(requests) // connections)
    await asyncio.gather(*(_client(port, requests, c * step, stop_at, phase) for c in range(connections)))
    phase.seconds = time.perf_counter() - started


def run_asyncio(endpoint: str, port: int, connections: int, seconds: float) -> Phase:
    phase = Phase(endpoint, seconds)
    asyncio.run(_drive(port, build_requests(endpoint, port), connections, seconds, phase))
    if phase.latencies:
        phase.p50_ms = quantile(phase.latencies, 0.50) * 1e3
        phase.p99_ms = quantile(phase.latencies, 0.99) * 1e3
    return phase


# ----------------------------------------------------------- generator: wrk

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(text: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s|m)$", text)
    return float(m.group(1)) * _UNITS[m.group(2)] if m else float("nan")


def _wrk_script(endpoint: str, workdir: Path) -> Path:
    """A Lua script that formats every request once and then cycles through them. livez gets
    one too (a table of one GET): the generator then does the same work per request for
    every endpoint, and its share of the machine is no different under plans."""
    payloads = bodies(endpoint)
    if payloads:
        lua = ", ".join(json.dumps(b.decode()) for b in payloads)
        method, headers = "POST", "{['Content-Type'] = 'application/json'}"
    else:
        lua, method, headers = "nil", "GET", "{}"
    script = workdir / f"{endpoint}.lua"
    script.write_text(
        f"local bodies = {{{lua}}}\nlocal requests = {{}}\nlocal i = 0\n"
        "function init(args)\n"
        f"  local headers = {headers}\n"
        f"  for k = 1, math.max(#bodies, 1) do\n"
        f"    requests[k] = wrk.format('{method}', '{PATHS[endpoint]}', headers, bodies[k])\n"
        "  end\n"
        "end\n"
        "function request()\n  i = i % #requests + 1\n  return requests[i]\nend\n"
    )
    return script


def run_wrk(
    endpoint: str, port: int, connections: int, seconds: float, cpu: int | None, workdir: Path
) -> Phase:
    url = f"http://{HOST}:{port}{PATHS[endpoint]}"
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency", "--timeout", "5s"]
    cmd += ["-s", str(_wrk_script(endpoint, workdir))]
    if cpu is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", str(cpu), *cmd]
    out = subprocess.run(
        [*cmd, url], check=False, capture_output=True, text=True, timeout=seconds + 30
    ).stdout
    phase = Phase(endpoint, float(max(1, round(seconds))))
    m = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m),", out)
    if m:
        phase.requests = int(m.group(1))
        phase.seconds = _ms(m.group(2) + m.group(3)) / 1e3
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    phase.errors = (int(non2xx.group(1)) if non2xx else 0) + (sum(map(int, sock.groups())) if sock else 0)
    for q, attr in (("50", "p50_ms"), ("99", "p99_ms")):
        mq = re.search(rf"^\s+{q}%\s+(\S+)", out, re.M)
        if mq:
            setattr(phase, attr, _ms(mq.group(1)))
    if not m:
        print("wrk output not understood:\n" + out, file=sys.stderr)
    return phase


def run_phase(
    generator: str,
    endpoint: str,
    port: int,
    connections: int,
    seconds: float,
    server_pid: int,
    client_cpu: int | None,
    workdir: Path,
) -> Phase:
    """One phase of load from `generator` ("wrk" or "asyncio"; wrk pinned to `client_cpu`),
    with the CPU the server spent on it."""
    cpu0 = server_cpu_seconds(server_pid)
    if generator == "wrk":
        phase = run_wrk(endpoint, port, connections, seconds, client_cpu, workdir)
    else:
        phase = run_asyncio(endpoint, port, connections, seconds)
    phase.server_cpu_s = server_cpu_seconds(server_pid) - cpu0
    return phase
