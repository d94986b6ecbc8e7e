"""Where one uvicorn worker spends its CPU under load: py-spy on a running server.

Starts the same server as bench_http (one worker, check worker off), drives one endpoint
with the bench's varied bodies for `--seconds`, and samples the server meanwhile with
`py-spy record --pid` (non-blocking, so the server is never paused). Prints the functions
with the most samples, by own time and by inclusive time (a function counts once per stack),
as a share of all samples, plus the server CPU per request measured in the same run.

    .venv/bin/python bench/profile_http.py --endpoint plans        # ~15 s
    .venv/bin/python bench/profile_http.py --endpoint mixed --top 40 --raw /tmp/mixed.txt

Needs py-spy (`pip install py-spy`; the dev extra has it) and ptrace rights over the server,
which a child process normally grants. Always exits 0.
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_line, table
from http_load import (
    ENDPOINT_NAMES,
    free_port,
    run_asyncio,
    run_phase,
    start_server,
    stop_server,
    wait_ready,
)

_FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _label(frame: str) -> str:
    """`function (package/module.py)`: line numbers dropped, so a function is one entry."""
    m = _FRAME.match(frame)
    if not m:
        return frame
    file = m.group("file")
    for marker in ("site-packages/", "/lib/python3"):
        if marker in file:
            file = file.split(marker, 1)[1]
    return f"{m.group('name')} ({file})"


def aggregate(raw: str) -> tuple[int, collections.Counter[str], collections.Counter[str]]:
    """Total samples, own samples and inclusive samples per function from py-spy's raw
    (collapsed-stack) output: `frame;frame;...;leaf count` per line."""
    total = 0
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_label(f) for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    return total, own, inclusive


def find_py_spy() -> str | None:
    """On PATH, or the script the installed py-spy package put beside its site-packages."""
    found = shutil.which("py-spy")
    if found:
        return found
    try:
        dist = importlib.metadata.distribution("py-spy")
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if file.name == "py-spy":
            path = Path(str(dist.locate_file(file))).resolve()
            if path.exists():
                return str(path)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoint", choices=ENDPOINT_NAMES, default="plans")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--raw", help="also keep py-spy's raw output here")
    ap.add_argument("--generator", choices=("auto", "wrk", "asyncio"), default="auto")
    args = ap.parse_args()
    py_spy = find_py_spy()
    if py_spy is None:
        print("py-spy not found: pip install py-spy")
        return 0
    generator = args.generator
    if generator == "auto":
        generator = "wrk" if shutil.which("wrk") else "asyncio"
    pin = (os.cpu_count() or 1) >= 2
    print(f"profile_http  {args.endpoint}, {args.seconds:g} s, {generator}, {machine_line()}")

    proc = None
    with tempfile.TemporaryDirectory() as tmp:
        raw_path = Path(args.raw or Path(tmp) / "raw.txt")
        try:
            port = free_port()
            proc = start_server(port, 0 if pin else None)
            wait_ready(port, proc)
            run_asyncio(args.endpoint, port, args.connections, 1.0)  # warm
            spy = subprocess.Popen(
                [py_spy, "record", "--pid", str(proc.pid), "--duration", str(round(args.seconds)),
                 "--rate", str(args.rate), "--nonblocking", "--format", "raw", "--output", str(raw_path)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
            time.sleep(0.5)  # py-spy attaches
            phase = run_phase(
                generator,
                args.endpoint,
                port,
                args.connections,
                args.seconds,
                proc.pid,
                1 if pin else None,
                Path(tmp),
            )
            _, err = spy.communicate(timeout=args.seconds + 30)
        finally:
            stop_server(proc)
        if not raw_path.exists():
            print(f"py-spy wrote nothing: {err.decode(errors='replace').strip()}")
            return 0
        total, own, inclusive = aggregate(raw_path.read_text())

    print(
        f"{phase.requests:,} requests, {phase.rps:,.0f} req/s, {phase.errors} errors, "
        f"server CPU {phase.cpu_us_per_request:,.0f} us/request; {total:,} samples"
    )
    for title, counts in (("own time", own), ("inclusive time", inclusive)):
        rows = [[f"{100 * n / total:5.1f}%", name] for name, n in counts.most_common(args.top)]
        print(f"\ntop {args.top} by {title}")
        print(table(["share", "function (module)"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
