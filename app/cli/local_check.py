"""A gradient check run here, without a server (`check` without --url): validated as the server
validates it, then run in local rank processes."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from app.cli.output import fail, validation_problem_of
from app.cli.progress import local_phase
from app.client import Json
from app.core.errors import DomainError
from app.core.problems import domain_problem
from app.ports import free_port
from app.worker.contract.rank_command import RANK_PROGRAM, torchrun_argv

# "direct" starts the ranks here; "torchrun" starts one torchrun, which starts them.
Launcher = Literal["direct", "torchrun"]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _tail(path: Path, limit: int = 1500) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace").strip()[-limit:]
    return ""


def run_local_check(
    body: Json,
    processes: int,
    timeout_s: float,
    on_progress: Callable[[str], None] | None = None,
    *,
    model_factory: str | None = None,
    launcher: Launcher = "direct",
) -> Json:
    """Run `python -m app.worker.gradcheck` in `processes` local ranks (gloo on loopback, or
    NCCL when there is a GPU per rank); returns a job shaped like GET /v1/checks/{id}.

    `launcher` "direct" starts the ranks itself (fast); "torchrun" starts one torchrun,
    which starts them, exactly as a job in the user's environment would run. `on_progress`
    hears the phase (progress.local_phase) while the ranks run."""
    job: Json = {
        "id": "local",
        "status": "running",
        "created_at": _now(),
        "started_at": _now(),
        "finished_at": None,
        "result": None,
        "error": None,
        "request": body,
    }
    with tempfile.TemporaryDirectory(prefix="batchplan-check-") as tmp:
        folder = Path(tmp)
        request_file = folder / "request.json"
        request_file.write_text(json.dumps(body))
        base_env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": str(processes),
            "LOCAL_WORLD_SIZE": str(processes),
        }
        base_env.setdefault("OMP_NUM_THREADS", "1")
        if sys.platform.startswith("linux"):
            base_env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only
        extra = ["--timeout-s", f"{timeout_s:g}"]
        if model_factory:
            extra += ["--model-factory", model_factory]
        argv = [sys.executable, "-m", RANK_PROGRAM, "--request-file", str(request_file), *extra]
        launches = [{"RANK": str(rank), "LOCAL_RANK": str(rank)} for rank in range(processes)]
        if launcher == "torchrun":
            argv = torchrun_argv(
                json.dumps(body),
                nproc_per_node=processes,
                rdzv_endpoint=f"127.0.0.1:{base_env['MASTER_PORT']}",
                extra=extra,
            )
            launches = [{}]
            for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
                base_env.pop(key)  # torchrun sets them for its ranks
        ranks: list[subprocess.Popen[bytes]] = []
        started = time.monotonic()
        if on_progress is not None:
            on_progress(f"starting {processes} ranks" + (" under torchrun" if launcher == "torchrun" else ""))
        try:
            for rank, launch in enumerate(launches):
                env = {**base_env, **launch}
                with (
                    (folder / f"rank{rank}.out").open("wb") as out,
                    (folder / f"rank{rank}.err").open("wb") as err,
                ):
                    ranks.append(
                        subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
                    )
            while True:
                codes = [r.poll() for r in ranks]
                elapsed = time.monotonic() - started
                if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                    break
                if elapsed > timeout_s:
                    job.update(
                        status="failed", error=f"the check did not finish within timeout_s={timeout_s:g}"
                    )
                    return job
                if on_progress is not None:
                    on_progress(local_phase(codes))
                with contextlib.suppress(subprocess.TimeoutExpired):
                    ranks[0].wait(timeout=0.2)
        finally:
            for r in ranks:
                if r.poll() is None:
                    r.kill()
                r.wait()
            job["finished_at"] = _now()
        failed = [(i, r.returncode) for i, r in enumerate(ranks) if r.returncode != 0]
        if failed:
            rank, code = failed[0]
            job.update(
                status="failed",
                error=f"rank {rank} exited with {code}: {_tail(folder / f'rank{rank}.err') or 'no output'}",
            )
            return job
        lines = _tail(folder / "rank0.out", 10**7).splitlines()
        try:
            job.update(status="succeeded", result=json.loads(lines[-1]))
        except (IndexError, ValueError):
            job.update(status="failed", error=f"rank 0 printed no result: {_tail(folder / 'rank0.err')}")
        return job


def prepare_local_check(body: Json, model_factory: str | None = None) -> tuple[Json, int]:
    """Validate as POST /v1/checks does; the body as the server would store it and the replica count."""
    from app.core.model_registry import SYNTHETIC, TARGET, parse_models, unknown_model
    from app.schemas.checks import CheckRequestIn
    from app.worker.contract.mesh_spec import mesh_world
    from app.worker.contract.request import build_spec, check_request

    try:
        check = CheckRequestIn.model_validate(body)
    except ValidationError as err:
        fail(validation_problem_of(("body", err)))
    if model_factory is not None and not TARGET.match(model_factory):
        fail({"detail": f"--model-factory {model_factory!r}: write it as package.module:factory"})
    if check.model != SYNTHETIC:
        try:
            registered = parse_models(os.environ.get("BATCHPLAN_CHECK_MODELS", ""))
        except ValueError as err:
            fail({"detail": f"BATCHPLAN_CHECK_MODELS: {err}"})
        if check.model not in registered:
            fail({"detail": unknown_model(check.model, list(registered)) + "; or give --model-factory"})
    if check.rendezvous is not None:
        fail({"detail": "a multi-node check (rendezvous) needs --url: the worker on every node joins it"})
    stored = check.model_dump(mode="json")
    try:
        # Built as the rank program builds it, so the same requests are refused here, at once.
        spec = build_spec(check_request({**stored, "model": model_factory or check.model}))
    except DomainError as err:
        fail(domain_problem(err))
    # A mesh check runs one process per mesh rank: its rank count stands in for the replicas.
    ranks = mesh_world(spec.mesh) if spec.mesh is not None else spec.data_parallel_size
    return stored, ranks
