"""Instructions per plan request, counted by valgrind: a figure the machine's load cannot move.

On a shared machine a timing moves by 30 % from one run to the next; the number of
instructions a request executes does not (valgrind's callgrind counts them, with a fixed hash
seed). This script counts them for the work a POST /v1/plans does in the app for a valid body,
stage by stage (json.loads, validation, to_core, plan, the JSON answer, and all of it as the
fast path runs it), for this working tree and for a baseline revision exported beside it, on
the same varied README and mixed-cluster bodies as bench_http, and prints both and their
ratio. Instructions are not time (cache misses and the interpreter's dispatch are not in
them), so bench_http's ratios stay the target; this says which change moved what.

Only the requests are counted: each stage runs inside `functools.reduce`, the function
callgrind is told to count (`--toggle-collect`), after a warm-up over every body.

    .venv/bin/python bench/bench_instructions.py                  # against HEAD, ~6 min
    .venv/bin/python bench/bench_instructions.py --base 0ad6b5c --stages all

Needs valgrind (`apt-get install valgrind`). Always exits 0.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, machine_line, table
from plan_bodies import varied_bodies

STAGES = ("all", "loads", "validate", "to_core", "plan", "json")
KINDS = ("plans", "mixed")

# Runs in a fresh interpreter with only the measured tree's `app` on sys.path (the bodies come
# from a file: bench's own modules would put this tree first).
PROGRAM = """
import functools, json, sys
root, kind, stage, n, bodies_file = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
sys.path.insert(0, root)
from app.schemas.plan_requests import PlanRequestIn
from app.core.planner import plan
from app.schemas.plan_responses import plan_json
def plan_answer(model):  # as app.api.plans has it (older revisions lack the name)
    return plan_json(plan(model.to_core()))
validate = PlanRequestIn.__pydantic_validator__.validate_python
try:  # what the fast path runs on a body (its own function since issue 26's second session)
    from app.api.plan_fast_path import answer
except ImportError:
    answer = lambda body: plan_answer(validate(json.loads(body), from_attributes=True))
bodies = [json.dumps(b).encode() for b in json.load(open(bodies_file))[kind]]
assert __import__("app").__file__.startswith(root), "measuring the wrong tree"
data = [json.loads(b) for b in bodies]
models = [validate(d, from_attributes=True) for d in data]
requests = [m.to_core() for m in models]
plans = [plan(r) for r in requests]
run = {
    "all": lambda i: answer(bodies[i]),
    "loads": lambda i: json.loads(bodies[i]),
    "validate": lambda i: validate(data[i], from_attributes=True),
    "to_core": lambda i: models[i].to_core(),
    "plan": lambda i: plan(requests[i]),
    "json": lambda i: plan_json(plans[i]),
}[stage]
for i in range(len(bodies)):
    run(i)
functools.reduce(lambda _, i: run(i % len(bodies)), range(n), None)
"""


def count(tree: Path, kind: str, stage: str, requests: int, program: Path, bodies: Path) -> float:
    """Instructions per request of `stage` for `kind` bodies, with `tree`'s code."""
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        "--toggle-collect=functools_reduce",
        sys.executable,
        str(program),
        str(tree),
        kind,
        stage,
        str(requests),
        str(bodies),
    ]
    env = dict(os.environ, PYTHONHASHSEED="0")
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, cwd=tree)
    out = done.stderr
    m = re.search(r"Collected : (\d+)", out)
    if done.returncode or not m or not int(m.group(1)):
        raise RuntimeError(f"callgrind said nothing for {tree} {kind} {stage}:\n{out[-2000:]}")
    return int(m.group(1)) / requests


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD", help="the baseline revision (default HEAD)")
    ap.add_argument("--requests", type=int, default=300, help="requests counted per stage")
    ap.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    ap.add_argument("--jobs", type=int, default=2, help="valgrind runs at a time")
    args = ap.parse_args()
    if not shutil.which("valgrind"):
        print("valgrind not found (apt-get install valgrind); nothing measured")
        return 0
    print(f"bench_instructions  {machine_line()}")
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        command = ["git", "archive", args.base, "app", "bench"]
        archive = subprocess.run(command, check=False, cwd=ROOT, capture_output=True)
        if archive.returncode:
            print(f"git archive {args.base} failed: {archive.stderr.decode().strip()}")
            return 0
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        program = Path(tmp) / "program.py"
        program.write_text(PROGRAM)
        bodies = Path(tmp) / "bodies.json"
        bodies.write_text(json.dumps({kind: varied_bodies(kind) for kind in KINDS}))
        trees = {"base": base, "tree": ROOT}
        jobs = [(k, s, t) for k in KINDS for s in args.stages for t in trees]
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            futures = {
                j: pool.submit(count, trees[j[2]], j[0], j[1], args.requests, program, bodies) for j in jobs
            }
            results = {}
            for job, future in futures.items():
                try:
                    results[job] = future.result()
                except RuntimeError as err:
                    print(f"ERROR: {err}")
    rows = []
    for kind in KINDS:
        for stage in args.stages:
            if (kind, stage, "base") in results and (kind, stage, "tree") in results:
                b, t = results[(kind, stage, "base")], results[(kind, stage, "tree")]
                rows.append([kind, stage, f"{b:,.0f}", f"{t:,.0f}", f"{t / b:.3f}"])
    print(f"\ninstructions per request; base = {args.base}, tree = the working tree")
    print(table(["body", "stage", "base", "tree", "tree/base"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
