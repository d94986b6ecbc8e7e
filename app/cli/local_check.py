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
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from app.cli.errors import fail, validation_problem_of
from app.cli.progress import local_phase
from app.client import Json
from app.contract.rank_command import RANK_PROGRAM, torchrun_argv
from app.core.errors.domain import DomainError
from app.core.errors.problems import domain_problem
from app.ports import free_port

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
        argv, env, launches = _launch(body, folder, processes, timeout_s, model_factory, launcher)
        if on_progress is not None:
            on_progress(f"starting {processes} ranks" + (" under torchrun" if launcher == "torchrun" else ""))
        ranks: list[subprocess.Popen[bytes]] = []
        try:
            for rank, launch in enumerate(launches):
                with (
                    (folder / f"rank{rank}.out").open("wb") as out,
                    (folder / f"rank{rank}.err").open("wb") as err,
                ):
                    ranks.append(
                        subprocess.Popen(
                            argv, env={**env, **launch}, stdin=subprocess.DEVNULL, stdout=out, stderr=err
                        )
                    )
            if not _wait(ranks, timeout_s, on_progress):
                job.update(status="failed", error=f"the check did not finish within timeout_s={timeout_s:g}")
                return job
        finally:
            for r in ranks:
                if r.poll() is None:
                    r.kill()
                r.wait()
            job["finished_at"] = _now()
        job.update(_outcome(ranks, folder))
        return job


def _launch(
    body: Json, folder: Path, processes: int, timeout_s: float, model_factory: str | None, launcher: Launcher
) -> tuple[list[str], dict[str, str], list[dict[str, str]]]:
    """The command, the environment every process shares, and each one's own variables."""
    request_file = folder / "request.json"
    request_file.write_text(json.dumps(body))
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(processes),
        "LOCAL_WORLD_SIZE": str(processes),
    }
    env.setdefault("OMP_NUM_THREADS", "1")
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only
    extra = ["--timeout-s", f"{timeout_s:g}"]
    if model_factory:
        extra += ["--model-factory", model_factory]
    if launcher == "direct":
        argv = [sys.executable, "-m", RANK_PROGRAM, "--request-file", str(request_file), *extra]
        return argv, env, [{"RANK": str(rank), "LOCAL_RANK": str(rank)} for rank in range(processes)]
    endpoint = f"127.0.0.1:{env['MASTER_PORT']}"
    for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        env.pop(key)  # torchrun sets them for its ranks
    return (
        torchrun_argv(json.dumps(body), nproc_per_node=processes, rdzv_endpoint=endpoint, extra=extra),
        env,
        [{}],
    )


def _wait(
    ranks: list[subprocess.Popen[bytes]], timeout_s: float, on_progress: Callable[[str], None] | None
) -> bool:
    """Until every rank exited, or one failed; False when the time ran out first."""
    started = time.monotonic()
    while True:
        codes = [r.poll() for r in ranks]
        if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
            return True
        if time.monotonic() - started > timeout_s:
            return False
        if on_progress is not None:
            on_progress(local_phase(codes))
        with contextlib.suppress(subprocess.TimeoutExpired):
            ranks[0].wait(timeout=0.2)


def _outcome(ranks: list[subprocess.Popen[bytes]], folder: Path) -> Json:
    """The job's status and its result (rank 0's last line) or error (the first failed rank's)."""
    failed = [(i, r.returncode) for i, r in enumerate(ranks) if r.returncode != 0]
    if failed:
        rank, code = failed[0]
        return {
            "status": "failed",
            "error": f"rank {rank} exited with {code}: {_tail(folder / f'rank{rank}.err') or 'no output'}",
        }
    lines = _tail(folder / "rank0.out", 10**7).splitlines()
    try:
        return {"status": "succeeded", "result": json.loads(lines[-1])}
    except (IndexError, ValueError):
        return {"status": "failed", "error": f"rank 0 printed no result: {_tail(folder / 'rank0.err')}"}


def prepare_local_check(body: Json, model_factory: str | None = None) -> tuple[Json, int]:
    """Validate as POST /v1/checks does; the body as the server would store it and the replica count."""
    from app.contract.mesh_spec import mesh_world
    from app.contract.model_registry import SYNTHETIC, TARGET, parse_models, unknown_model
    from app.contract.request import build_spec, echoed
    from app.schemas.checks import CheckRequestIn

    try:
        check = CheckRequestIn.model_validate(body)
    except ValidationError as err:
        fail(validation_problem_of(("body", err)))
    if model_factory is not None and not TARGET.match(model_factory):
        fail({"detail": f"--model-factory {model_factory!r}: write it as package.module:factory"})
    factory = model_factory
    if check.model != SYNTHETIC:
        try:
            registered = parse_models(os.environ.get("BATCHPLAN_CHECK_MODELS", ""))
        except ValueError as err:
            fail({"detail": f"BATCHPLAN_CHECK_MODELS: {err}"})
        if check.model not in registered:
            fail({"detail": unknown_model(check.model, list(registered)) + "; or give --model-factory"})
        factory = registered[check.model]
    if check.rendezvous is not None:
        fail({"detail": "a multi-node check (rendezvous) needs --url: the worker on every node joins it"})
    stored = check.model_dump(mode="json")
    try:
        # Built as the rank program builds it, so the same requests are refused here, at once.
        # A factory whose module is not here is refused now, not by every rank's traceback.
        request = check.to_core()
        named = replace(request.options, model=model_factory or check.model)
        flag = model_factory is not None
        spec = build_spec(replace(request, options=named), factory=factory, factory_flag=flag)
    except DomainError as err:
        fail(domain_problem(err))
    # A mesh check runs one process per mesh rank: its rank count stands in for the replicas.
    ranks = mesh_world(spec.mesh) if spec.mesh is not None else spec.data_parallel_size
    return echoed(stored, spec), ranks
