"""The `batchplan` command: plan, export and check locally with the core, or against a server with --url.

Local and server answers are the same JSON; errors are the server's problem+json in both
cases (the local path builds them with the server's own handlers), printed as the detail,
the other field errors and the suggestions, with exit status 2.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError

from app.client import BatchplanClient, BatchplanError, CheckTimeout, ProblemError
from app.core.errors import PlanError
from app.core.exports import EXPORTERS, ExportInput
from app.core.models import Divisibility, LossReduction, LRRule, Optimizer
from app.core.planner import plan as plan_locally
from app.core.problems import domain_problem, validation_problem
from app.ports import free_port
from app.schemas.plan_requests import PlanRequestIn
from app.schemas.plan_responses import PlanOut

cli = typer.Typer(
    help="Split a distributed PyTorch batch exactly.", no_args_is_help=True, add_completion=False
)

Json = dict[str, Any]
VIEWS = ("table", "json")
FORMAT_HELP = f"Output: {', '.join(VIEWS)}, or an export format: {', '.join(EXPORTERS)}."
NODE_GROUP_HELP = (
    "A mixed cluster, one group per flag: NAME:NODES:GPUS_PER_NODE[:THROUGHPUT[:CAP]] "
    "(e.g. h100:2:8:2.0:64). Instead of --num-nodes/--gpus-per-node."
)


class Backend(StrEnum):
    AUTO = "auto"
    GLOO = "gloo"
    NCCL = "nccl"


class Launcher(StrEnum):
    DIRECT = "direct"
    TORCHRUN = "torchrun"


class DType(StrEnum):
    FLOAT64 = "float64"
    FLOAT32 = "float32"


# Plan flags, shared by `plan`, `export` and `check`.
NumNodes = Annotated[int | None, typer.Option(help="Nodes in the cluster (default: 1).", show_default=False)]
GpusPerNode = Annotated[int | None, typer.Option(help="GPUs per node (default: 8).", show_default=False)]
NodeGroups = Annotated[
    list[str] | None, typer.Option("--node-group", help=NODE_GROUP_HELP, show_default=False)
]
GlobalBatch = Annotated[int | None, typer.Option("--global-batch-size", "-b")]
MicroBatch = Annotated[int | None, typer.Option("--micro-batch-size", "-m")]
Accumulation = Annotated[int | None, typer.Option("--accumulation", "-g")]
MaxMicro = Annotated[int | None, typer.Option(help="Micro-batch cap per GPU.")]
NumSamples = Annotated[int | None, typer.Option(help="Dataset size (adds the sampler).")]
BaseLr = Annotated[float | None, typer.Option(help="Adds the learning rate.")]
RequestFile = Annotated[
    Path | None, typer.Option(help="A JSON plan request (overrides the plan flags).", show_default=False)
]
Url = Annotated[
    str | None, typer.Option(help="A batchplan server, e.g. http://127.0.0.1:8000 (default: compute here).")
]
ApiKey = Annotated[
    str | None,
    typer.Option(envvar="BATCHPLAN_API_KEY", help="Sent as Authorization: Bearer.", show_default=False),
]
Output = Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file instead of stdout.")]


def make_client(url: str, api_key: str | None) -> BatchplanClient:
    """The client every --url command uses (tests may replace it)."""
    # A command prints its answer, not httpx's request log (when something set up INFO logging).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return BatchplanClient(url, api_key=api_key, timeout=60.0)


# ----------------------------------------------------------------------------- errors


def _fail(problem: Json, code: int = 2) -> NoReturn:
    typer.echo(f"error: {problem.get('detail') or problem.get('title') or 'request failed'}", err=True)
    errors = problem.get("errors") or []
    for item in errors[1:] if isinstance(errors, list) else []:
        if isinstance(item, dict):
            typer.echo(f"  {item.get('pointer') or '/'}: {item.get('detail')}", err=True)
    suggestions = problem.get("suggestions") or {}
    for field, values in suggestions.items() if isinstance(suggestions, dict) else []:
        typer.echo(f"  try {field}: {', '.join(map(str, values))}", err=True)
    raise typer.Exit(code)


def _fail_client(err: BatchplanError) -> NoReturn:
    if isinstance(err, ProblemError):
        problem = dict(err.problem)
        if err.status == 401:
            problem["detail"] = f"{err.detail} (give --api-key or set BATCHPLAN_API_KEY)"
        if err.retry_after is not None:
            problem["detail"] = f"{err.detail} (Retry-After: {err.retry_after:g} s)"
        _fail(problem)
    _fail({"detail": str(err)})


def _validation_problem(*errors: tuple[str, ValidationError]) -> Json:
    """As the server reports schema errors; `where` is FastAPI's location ("body", "query")."""
    return validation_problem({**e, "loc": (where, *e["loc"])} for where, err in errors for e in err.errors())


@contextlib.contextmanager
def _client_errors() -> Iterator[None]:
    try:
        yield
    except BatchplanError as err:
        _fail_client(err)


# ----------------------------------------------------------------------------- requests


def _node_group(text: str) -> Json:
    parts = text.split(":")
    if not 3 <= len(parts) <= 5:
        raise typer.BadParameter(
            f"{text!r}: expected NAME:NODES:GPUS_PER_NODE[:THROUGHPUT[:CAP]]", param_hint="--node-group"
        )
    group: Json = {}
    if parts[0]:
        group["name"] = parts[0]
    try:
        group["num_nodes"] = int(parts[1])
        group["gpus_per_node"] = int(parts[2])
        if len(parts) > 3 and parts[3]:
            throughput = float(parts[3])
            if not math.isfinite(throughput):
                raise ValueError(parts[3])
            group["relative_throughput"] = throughput
        if len(parts) > 4 and parts[4]:
            group["max_micro_batch_size"] = int(parts[4])
    except ValueError as err:
        raise typer.BadParameter(
            f"{text!r}: NODES, GPUS_PER_NODE and CAP are whole numbers, THROUGHPUT a finite number ({err})",
            param_hint="--node-group",
        ) from None
    return group


def _request_body(**flags: Any) -> Json:
    topology: Json = {}
    if flags["node_groups"]:
        topology["node_groups"] = [_node_group(g) for g in flags["node_groups"]]
        # Both forms at once: left to the schema, which says so the same way here and on a server.
        for name in ("num_nodes", "gpus_per_node"):
            if flags[name] is not None:
                topology[name] = flags[name]
    else:
        topology["num_nodes"] = 1 if flags["num_nodes"] is None else flags["num_nodes"]
        topology["gpus_per_node"] = 8 if flags["gpus_per_node"] is None else flags["gpus_per_node"]
    body: Json = {"topology": topology}
    for name in (
        "global_batch_size",
        "micro_batch_size",
        "gradient_accumulation_steps",
        "max_micro_batch_size",
    ):
        if flags[name] is not None:
            body[name] = flags[name]
    body["divisibility"] = flags["divisibility"].value
    body["loss_reduction"] = flags["loss_reduction"].value
    body["parallelism"] = {
        "tensor": flags["tensor"],
        "pipeline": flags["pipeline"],
        "context": flags["context"],
    }
    if flags["num_samples"] is not None:
        body["dataset"] = {
            "num_samples": flags["num_samples"],
            "drop_last": flags["drop_last"],
            "shuffle": not flags["no_shuffle"],
            "seed": flags["data_seed"],
        }
        if flags["epochs"] is not None:
            body["dataset"]["epochs"] = flags["epochs"]
    if flags.get("base_lr") is not None:
        lr: Json = {
            "base_lr": flags["base_lr"],
            "base_batch_size": flags["base_batch_size"],
            "rule": flags["rule"].value,
            "optimizer": flags["optimizer"].value,
        }
        for name in ("warmup_epochs", "warmup_steps"):
            if flags[name] is not None:
                lr[name] = flags[name]
        body["learning_rate"] = lr
    return body


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as err:
        _fail({"detail": f"cannot read {path}: {err.strerror or err}"})
    except ValueError as err:
        _fail({"detail": f"{path} is not valid JSON: {err}"})


def _body(request: Path | None, flags: Json) -> Json:
    if request is None:
        return _request_body(**flags)
    data = _read_json(request)
    if not isinstance(data, dict):
        _fail({"detail": f"{request} must hold a JSON object (a plan request)"})
    return data


def compute(body: Json, url: str | None, api_key: str | None = None) -> Json:
    """The plan as JSON, identical whether computed here or by a server."""
    if url:
        with _client_errors(), make_client(url, api_key) as client:
            return client.plan(body)
    try:
        request = PlanRequestIn.model_validate(body)
        return PlanOut.model_validate(plan_locally(request.to_core())).model_dump(mode="json")
    except ValidationError as err:
        _fail(_validation_problem(("body", err)))
    except PlanError as err:
        _fail(domain_problem(err))


def export_text(fmt: str, body: Json, options: Json, url: str | None, api_key: str | None = None) -> str:
    """An export, identical whether written here or by a server."""
    if url:
        with _client_errors(), make_client(url, api_key) as client:
            return client.export(fmt, body, **options)
    from app.schemas.exports import ExportOptionsIn

    # FastAPI reports query errors before body errors: the same order here.
    invalid: list[tuple[str, ValidationError]] = []
    try:
        export_options = ExportOptionsIn.model_validate(options)
    except ValidationError as err:
        invalid.append(("query", err))
    try:
        request = PlanRequestIn.model_validate(body)
    except ValidationError as err:
        invalid.append(("body", err))
    if invalid:
        _fail(_validation_problem(*invalid))
    exporter = EXPORTERS.get(fmt)
    if exporter is None:
        shown = re.sub(r"[^A-Za-z0-9_.-]", "?", fmt[:40])
        _fail({"detail": f"unknown export format '{shown}'; known formats: {', '.join(EXPORTERS)}"})
    try:
        core_request = request.to_core()
        return exporter(ExportInput(core_request, plan_locally(core_request), export_options.to_core())).text
    except PlanError as err:
        _fail(domain_problem(err))


# ----------------------------------------------------------------------------- output


def _table(result: Json) -> str:
    micro = result["micro_batch_size"]
    lines = [
        f"world size {result['world_size']}, model-parallel {result['model_parallel_size']}, "
        f"data-parallel {result['data_parallel_size']}",
        f"global batch {result['global_batch_size']} (asked {result['requested_global_batch_size']}), "
        f"micro {micro if micro is not None else 'per group'}, "
        f"accumulation {result['gradient_accumulation_steps']}",
        "",
        f"{'ranks':>15}  {'group':<12} {'micro':>6} {'per step':>9} {'loss scale':>11}",
    ]
    for g in result["replica_groups"]:
        ranks = f"{g['start']}-{g['stop'] - 1}"
        lines.append(
            f"{ranks:>15}  {g['node_group']:<12} {g['micro_batch_size']:>6} "
            f"{g['samples_per_step']:>9} {g['loss_scale']:>11.6g}"
        )
    if result.get("sampler"):
        s = result["sampler"]
        lines += [
            "",
            f"sampler {s['kind']}: {s['micro_steps_per_epoch']} micro-steps, "
            f"{s['optimizer_steps_per_epoch']} optimizer steps per epoch, "
            f"{s['padded_samples']} padded, {s['dropped_samples']} dropped",
        ]
    if result.get("learning_rate"):
        lr = result["learning_rate"]
        lines.append(
            f"learning rate {lr['lr']:.6g} ({lr['rule']} x{lr['factor']:.6g}), "
            f"warmup {lr['warmup_steps']} steps from {lr['warmup_start_lr']:.6g}"
        )
    lines += ["", *(f"warning: {w}" for w in result["warnings"])]
    lines += [f"- {e}" for e in result["explanation"]]
    return "\n".join(lines).rstrip()


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        typer.echo(text, nl=not text.endswith("\n"))
        return
    try:
        output.write_text(text if text.endswith("\n") else text + "\n")
    except OSError as err:
        _fail({"detail": f"cannot write {output}: {err.strerror or err}"})
    typer.echo(f"wrote {output}", err=True)


def _render(fmt: str, body: Json, options: Json, url: str | None, api_key: str | None) -> str:
    if fmt == "json":
        return json.dumps(compute(body, url, api_key), indent=2)
    if fmt == "table":
        return _table(compute(body, url, api_key))
    return export_text(fmt, body, options, url, api_key)


def _export_options(script: str | None, job_name: str | None, image: str | None, port: int | None) -> Json:
    given = {"script": script, "job_name": job_name, "image": image, "port": port}
    return {k: v for k, v in given.items() if v is not None}


# ----------------------------------------------------------------------------- plan / export


@cli.command()
def plan(
    num_nodes: NumNodes = None,
    gpus_per_node: GpusPerNode = None,
    node_groups: NodeGroups = None,
    global_batch_size: GlobalBatch = None,
    micro_batch_size: MicroBatch = None,
    gradient_accumulation_steps: Accumulation = None,
    max_micro_batch_size: MaxMicro = None,
    divisibility: Divisibility = Divisibility.EXACT,
    loss_reduction: LossReduction = LossReduction.MEAN,
    tensor: int = 1,
    pipeline: int = 1,
    context: int = 1,
    num_samples: NumSamples = None,
    drop_last: bool = False,
    no_shuffle: bool = False,
    data_seed: Annotated[int, typer.Option("--seed", "--data-seed", help="Sampler shuffle seed.")] = 0,
    epochs: int | None = None,
    base_lr: BaseLr = None,
    base_batch_size: int = 256,
    rule: LRRule = LRRule.AUTO,
    optimizer: Optimizer = Optimizer.SGD,
    warmup_epochs: float | None = None,
    warmup_steps: int | None = None,
    request: RequestFile = None,
    url: Url = None,
    api_key: ApiKey = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help=FORMAT_HELP)] = "table",
    as_json: Annotated[bool, typer.Option("--json", help="Same as --format json.")] = False,
    script: Annotated[
        str | None, typer.Option(help="Exports: the training script (default: train.py).")
    ] = None,
    job_name: Annotated[
        str | None, typer.Option(help="Exports: Slurm/PyTorchJob name (default: batchplan).")
    ] = None,
    image: Annotated[str | None, typer.Option(help="Exports: the PyTorchJob container image.")] = None,
    master_port: Annotated[
        int | None, typer.Option(help="Exports: rendezvous port (default: 29500).")
    ] = None,
    output: Output = None,
) -> None:
    """Plan a batch split (locally with the core, or on a server with --url)."""
    flags = dict(locals())
    body = _body(request, flags)
    chosen = "json" if as_json else fmt
    _emit(_render(chosen, body, _export_options(script, job_name, image, master_port), url, api_key), output)


@cli.command()
def export(
    fmt: Annotated[str, typer.Argument(metavar="FORMAT", help=", ".join(EXPORTERS))],
    num_nodes: NumNodes = None,
    gpus_per_node: GpusPerNode = None,
    node_groups: NodeGroups = None,
    global_batch_size: GlobalBatch = None,
    micro_batch_size: MicroBatch = None,
    gradient_accumulation_steps: Accumulation = None,
    max_micro_batch_size: MaxMicro = None,
    divisibility: Divisibility = Divisibility.EXACT,
    loss_reduction: LossReduction = LossReduction.MEAN,
    tensor: int = 1,
    pipeline: int = 1,
    context: int = 1,
    num_samples: NumSamples = None,
    drop_last: bool = False,
    no_shuffle: bool = False,
    data_seed: Annotated[int, typer.Option("--seed", "--data-seed", help="Sampler shuffle seed.")] = 0,
    epochs: int | None = None,
    base_lr: BaseLr = None,
    base_batch_size: int = 256,
    rule: LRRule = LRRule.AUTO,
    optimizer: Optimizer = Optimizer.SGD,
    warmup_epochs: float | None = None,
    warmup_steps: int | None = None,
    request: RequestFile = None,
    url: Url = None,
    api_key: ApiKey = None,
    script: Annotated[str | None, typer.Option(help="The training script (default: train.py).")] = None,
    job_name: Annotated[str | None, typer.Option(help="Slurm/PyTorchJob name (default: batchplan).")] = None,
    image: Annotated[str | None, typer.Option(help="The PyTorchJob container image.")] = None,
    master_port: Annotated[int | None, typer.Option(help="Rendezvous port (default: 29500).")] = None,
    output: Output = None,
) -> None:
    """Write the plan for a launcher or trainer: the same as `plan --format FORMAT`."""
    flags = dict(locals())
    body = _body(request, flags)
    _emit(export_text(fmt, body, _export_options(script, job_name, image, master_port), url, api_key), output)


# ----------------------------------------------------------------------------- check


class Progress:
    """A spinner with the elapsed time on a terminal; otherwise a plain line when the status
    changes and every `every_s` seconds. Always on stderr, so stdout stays the result."""

    def __init__(self, label: str, every_s: float = 5.0) -> None:
        self.label = label
        self.every_s = every_s
        self.tty = sys.stderr.isatty()
        self._status: Any = None
        self._last: tuple[str | None, float] = (None, -math.inf)

    def __enter__(self) -> Progress:
        if self.tty:
            from rich.console import Console

            self._status = Console(stderr=True).status(f"{self.label}: starting")
            self._status.start()
        return self

    def __call__(self, job: Json, elapsed: float) -> None:
        status = str(job.get("status"))
        text = f"{self.label}: {status}, {elapsed:.1f} s"
        if self._status is not None:
            self._status.update(text)
            return
        last_status, last_at = self._last
        if status != last_status or elapsed - last_at >= self.every_s:
            typer.echo(text, err=True)
            self._last = (status, elapsed)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._status is not None:
            self._status.stop()


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
    on_progress: Callable[[Json, float], None] | None = None,
    *,
    model_factory: str | None = None,
    launcher: str = "direct",
) -> Json:
    """Run `python -m app.worker.gradcheck` in `processes` local ranks (gloo on loopback, or
    NCCL when there is a GPU per rank); returns a job shaped like GET /v1/checks/{id}.

    `launcher` "direct" starts the ranks itself (fast); "torchrun" starts one torchrun,
    which starts them, exactly as a job in the user's environment would run."""
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
        argv = [sys.executable, "-m", "app.worker.gradcheck", "--request-file", str(request_file), *extra]
        launches = [{"RANK": str(rank), "LOCAL_RANK": str(rank)} for rank in range(processes)]
        if launcher == "torchrun":
            from app.worker.gradcheck import torchrun_argv

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
                    on_progress(job, elapsed)
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


def _check_body(request: Path | None, flags: Json) -> Json:
    """A check request: --request holds a plan request or a whole check request."""
    if request is None:
        body: Json = {"plan": _request_body(**flags)}
    else:
        data = _body(request, flags)
        body = data if "plan" in data else {"plan": data}
    for key, value in (("backend", flags["backend"]), ("dtype", flags["dtype"]), ("seed", flags["seed"])):
        if value is not None:
            body[key] = value.value if isinstance(value, StrEnum) else value
    if flags["timeout"] is not None:
        body["timeout_s"] = flags["timeout"]
    if flags["model"] is not None:
        body["model"] = flags["model"]
    if flags["noise_steps"] is not None or flags["noise_lr"] is not None:
        noise = body.setdefault("noise_scale", {})
        if flags["noise_steps"] is not None:
            noise["steps"] = flags["noise_steps"]
        if flags["noise_lr"] is not None:
            noise["learning_rate"] = flags["noise_lr"]
    if flags["fit_micro_batch"] or flags["fit_memory_bytes"] is not None:
        fit = body.setdefault("fit_micro_batch", {})
        if flags["fit_memory_bytes"] is not None:
            fit["memory_bytes"] = flags["fit_memory_bytes"]
        if flags["safety_margin"] is not None:
            fit["safety_margin"] = flags["safety_margin"]
    return body


def _prepare_local_check(body: Json, model_factory: str | None = None) -> tuple[Json, int]:
    """Validate as POST /v1/checks does; the body as the server would store it and the replica count."""
    from app.core.model_registry import SYNTHETIC, TARGET, parse_models, unknown_model
    from app.schemas.checks import CheckRequestIn
    from app.worker.spec import SpecError, spec_from_plan

    try:
        check = CheckRequestIn.model_validate(body)
    except ValidationError as err:
        _fail(_validation_problem(("body", err)))
    if model_factory is not None and not TARGET.match(model_factory):
        _fail({"detail": f"--model-factory {model_factory!r}: write it as package.module:factory"})
    if check.model != SYNTHETIC:
        try:
            registered = parse_models(os.environ.get("BATCHPLAN_CHECK_MODELS", ""))
        except ValueError as err:
            _fail({"detail": f"BATCHPLAN_CHECK_MODELS: {err}"})
        if check.model not in registered:
            _fail({"detail": unknown_model(check.model, list(registered)) + "; or give --model-factory"})
    if check.rendezvous is not None:
        _fail({"detail": "a multi-node check (rendezvous) needs --url: the worker on every node joins it"})
    try:
        core_request = check.plan.to_core()
        spec = spec_from_plan(
            plan_locally(core_request),
            dtype=check.dtype,
            seed=check.seed,
            backend=check.backend,
            dataset=core_request.dataset,
        )
    except SpecError as err:
        _fail(domain_problem(err))
    except PlanError as err:
        _fail(domain_problem(err.under("/plan")))  # it names a field of the plan, which sits under /plan here
    return check.model_dump(mode="json"), spec.data_parallel_size


def _show_check(job: Json, as_json: bool) -> int:
    """Print a finished check; the exit status: 0 passed, 1 ran and failed, 2 did not run."""
    result = job.get("result") if job.get("status") == "succeeded" else None
    if as_json:
        typer.echo(json.dumps(job, indent=2))
    if not isinstance(result, dict):
        typer.echo(
            f"error: check {job.get('id')} {job.get('status')}: {job.get('error') or 'no result'}", err=True
        )
        return 2
    passed = bool(result.get("passed"))
    if not as_json:
        held = result["rel_l2"] <= result["tolerance"]
        lines = [
            f"{'PASSED' if passed else 'FAILED'}: the DDP gradient "
            f"{'matches' if held else 'does NOT match'} the single-process gradient of the global batch",
            f"  rel_l2 {result['rel_l2']:.3g} (tolerance {result['tolerance']:.3g}), "
            f"max abs diff {result['max_abs_diff']:.3g}",
            f"  {result['backend']} on {result['device']}: {result['processes']} processes for "
            f"{result['data_parallel_size']} replicas ({result['replicas_per_process']} per process)",
            "controls (wrong setups the check must tell apart):",
        ]
        for c in result.get("controls", []):
            seen = "detected" if c.get("detected") else "MISSED"
            lines.append(
                f"  {seen:<9} {c['name']:<28} rel_l2 {c['rel_l2']:<10.3g} {c.get('description', '')}"
            )
        if not result.get("controls"):
            lines.append("  (none applies to this plan)")
        lines += _model_lines(result)
        typer.echo("\n".join(line.rstrip() for line in lines))
    return 0 if passed else 1


def _model_lines(result: Json) -> list[str]:
    """The model's DDP equivalence, its noise scale and the micro-batch search, when present."""
    lines: list[str] = []
    equivalence = result.get("ddp_equivalence")
    if isinstance(equivalence, dict):
        lines.append(f"model {result.get('model', 'synthetic')}: {equivalence['summary']}")
        for finding in equivalence.get("findings", []):
            mark = "breaks" if finding["breaks_equivalence"] else "note"
            where = f" ({', '.join(finding['modules'])})" if finding.get("modules") else ""
            lines.append(f"  {mark:<6} {finding['cause']}{where}: {finding['detail']}")
            lines.append(f"         fix: {finding['fix']}")
    noise = result.get("noise_scale")
    if isinstance(noise, dict):
        value = noise.get("b_simple")
        spread = f" +/- {noise['stderr']:.3g}" if noise.get("stderr") is not None else ""
        shown = f"{value:.4g}{spread} samples" if value is not None else "not measurable"
        lines.append(f"gradient noise scale B_simple: {shown} over {noise['steps']} steps")
        lines.append(f"  {noise['recommendation']}")
    search = result.get("micro_batch_search")
    if isinstance(search, dict):
        planned = search["planned"]
        lines.append(
            f"largest micro-batch that fits: {search['max_micro_batch_size']}"
            f"{' (the search limit)' if search.get('hit_limit') else ''} in {search['budget_bytes']} of "
            f"{search['capacity_bytes']} bytes; planned micro-batch {planned['micro_batch_sizes']} x "
            f"{planned['gradient_accumulation_steps']} accumulation steps for global batch "
            f"{planned['global_batch_size']}"
        )
    return lines


@cli.command()
def check(
    num_nodes: NumNodes = None,
    gpus_per_node: GpusPerNode = None,
    node_groups: NodeGroups = None,
    global_batch_size: GlobalBatch = None,
    micro_batch_size: MicroBatch = None,
    gradient_accumulation_steps: Accumulation = None,
    max_micro_batch_size: MaxMicro = None,
    divisibility: Divisibility = Divisibility.EXACT,
    loss_reduction: LossReduction = LossReduction.MEAN,
    tensor: int = 1,
    pipeline: int = 1,
    context: int = 1,
    num_samples: NumSamples = None,
    drop_last: bool = False,
    no_shuffle: bool = False,
    data_seed: Annotated[int, typer.Option("--data-seed", help="Sampler shuffle seed.")] = 0,
    epochs: int | None = None,
    request: Annotated[
        Path | None,
        typer.Option(
            help="A JSON plan request, or a whole check request {plan, backend, ...}.", show_default=False
        ),
    ] = None,
    backend: Annotated[Backend | None, typer.Option(help="(default: auto)", show_default=False)] = None,
    dtype: Annotated[DType | None, typer.Option(help="(default: float64)", show_default=False)] = None,
    seed: Annotated[
        int | None, typer.Option(help="Weights and data seed (default: 0).", show_default=False)
    ] = None,
    timeout: Annotated[float | None, typer.Option(help="Kill the check after this many seconds.")] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="A check model by its registered name (BATCHPLAN_CHECK_MODELS; default: synthetic)."
        ),
    ] = None,
    model_factory: Annotated[
        str | None,
        typer.Option(
            help="Local only: train package.module:factory's (model, dataset, loss_fn) in this environment.",
            show_default=False,
        ),
    ] = None,
    noise_steps: Annotated[
        int | None,
        typer.Option(
            help="Steps that measure the gradient noise scale (default: 8 for a registered model or factory, "
            "else 0).",
            show_default=False,
        ),
    ] = None,
    noise_lr: Annotated[
        float | None,
        typer.Option(help="SGD learning rate between those steps (default: 0).", show_default=False),
    ] = None,
    fit_micro_batch: Annotated[
        bool, typer.Option(help="Find the largest micro-batch that fits one device; re-plan with it.")
    ] = False,
    fit_memory_bytes: Annotated[
        int | None,
        typer.Option(
            help="The device memory to fit into (needed on CPU; implies --fit-micro-batch).",
            show_default=False,
        ),
    ] = None,
    safety_margin: Annotated[
        float | None,
        typer.Option(help="Fraction of that memory kept free (default: 0.1).", show_default=False),
    ] = None,
    launcher: Annotated[
        Launcher, typer.Option(help="Local only: start the ranks directly, or under torchrun.")
    ] = Launcher.DIRECT,
    processes: Annotated[
        int | None, typer.Option(help="Local only: rank processes (default: replicas, at most 4).")
    ] = None,
    wait: Annotated[
        float | None,
        typer.Option(help="With --url: stop waiting after this many seconds (default: timeout + 60)."),
    ] = None,
    url: Url = None,
    api_key: ApiKey = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the finished job as JSON.")] = False,
) -> None:
    """Prove a plan: one real DDP step vs. a single-process gradient (exit 0 passed, 1 failed, 2 error)."""
    flags = dict(locals())
    body = _check_body(request, flags)
    if model_factory and url:
        _fail(
            {"detail": "--model-factory runs your code here; a server runs only registered names (--model)"}
        )
    if model_factory and model:
        _fail({"detail": "give --model (a registered name) or --model-factory, not both"})
    if url:
        with _client_errors(), make_client(url, api_key) as client:
            job = client.submit_check(body)
            label = f"check {job['id']}"
            try:
                with Progress(label) as progress:
                    done = client.wait_check(
                        job["id"], timeout=wait or (timeout or 120.0) + 60.0, poll=0.25, on_progress=progress
                    )
            except CheckTimeout as err:
                _fail({"detail": str(err)})
            except KeyboardInterrupt:
                with contextlib.suppress(BatchplanError):
                    client.cancel_check(job["id"])
                typer.echo(f"{label}: cancelled", err=True)
                raise typer.Exit(130) from None
    else:
        stored, replicas = _prepare_local_check(body, model_factory)
        count = processes or min(replicas, 4)
        if not 1 <= count <= replicas:
            _fail({"detail": f"--processes must be between 1 and the {replicas} replicas of the plan"})
        label = f"local check ({count} processes)"
        try:
            with Progress(label) as progress:
                done = run_local_check(
                    stored,
                    count,
                    timeout or 120.0,
                    progress,
                    model_factory=model_factory,
                    launcher=launcher.value,
                )
        except KeyboardInterrupt:
            typer.echo(f"{label}: interrupted; its processes were stopped", err=True)
            raise typer.Exit(130) from None
    raise typer.Exit(_show_check(done, as_json))


@cli.command()
def host(url: Annotated[str, typer.Option(help="A batchplan server.")], api_key: ApiKey = None) -> None:
    """What a server's worker can run (GET /v1/host), as JSON."""
    with _client_errors(), make_client(url, api_key) as client:
        typer.echo(json.dumps(client.host(), indent=2))


@cli.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Default: BATCHPLAN_HOST or 127.0.0.1.")] = None,
    port: Annotated[int | None, typer.Option(help="Default: BATCHPLAN_PORT or 8000.")] = None,
) -> None:
    """Run the HTTP server (uvicorn, one worker)."""
    import uvicorn

    from app.settings import Settings

    settings = Settings()
    uvicorn.run(
        "app.main:app", host=host or settings.host, port=port or settings.port, log_level=settings.log_level
    )


def main() -> None:
    cli(prog_name="batchplan")


if __name__ == "__main__":
    main()
