"""`batchplan check`: prove a plan with one real DDP step (or a run of --steps), on a server
(--url) or here."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from app.cli.compute import make_client
from app.cli.flag_groups import with_flag_groups
from app.cli.local_check import Launcher, prepare_local_check, run_local_check
from app.cli.lr_scaling_table import save_lr_chart
from app.cli.options import ApiKey, PlanFlags, Url
from app.cli.output import client_errors, fail, show_check
from app.cli.progress import Progress, ServerPhase
from app.cli.requests import plan_body, plan_request
from app.cli.run_table import chart_format, draw_chart
from app.client import BatchplanError, CheckTimeout, Json
from app.contract.check_options import DEFAULT_NOISE_STEPS, Backend, CheckWorkload, DType

CheckRequestFile = Annotated[
    Path | None,
    typer.Option(
        help="A JSON plan request, or a whole check request {plan, backend, ...}.", show_default=False
    ),
]


@dataclass(frozen=True)
class CheckFlags:
    """What the check runs: they set the check request's fields over the plan's (and --request's)."""

    backend: Annotated[
        Backend | None,
        typer.Option(
            help="auto: NCCL with a GPU per rank, else gloo on CPU (default: auto).", show_default=False
        ),
    ] = None
    dtype: Annotated[
        DType | None, typer.Option(help="Precision of the step (default: float64).", show_default=False)
    ] = None
    seed: Annotated[
        int | None,
        typer.Option(
            help="The check's seed (default: 0): model weights, synthetic samples, and the "
            "shuffle when there is no dataset. The sampler's seed is --data-seed.",
            show_default=False,
        ),
    ] = None
    timeout: Annotated[float | None, typer.Option(help="Kill the check after this many seconds.")] = None
    steps: Annotated[
        int | None,
        typer.Option(
            help="Optimizer steps (default 1: the first step's gradient). More train the plan's recipe "
            "and hold every step against a single-process run, with the run-level controls.",
            show_default=False,
        ),
    ] = None
    resume_at: Annotated[
        int | None,
        typer.Option(
            help="With --steps: checkpoint the run after this many optimizer steps and resume it on "
            "--resume-replicas replicas (the plan re-made for them, the same global batch; at most "
            "the plan's replicas).",
            show_default=False,
        ),
    ] = None
    model: Annotated[
        str | None,
        typer.Option(
            help="A check model by its registered name (BATCHPLAN_CHECK_MODELS; default: synthetic)."
        ),
    ] = None
    model_factory: Annotated[
        str | None,
        typer.Option(
            help="Local only: train package.module:factory's (model, dataset, loss_fn) in this environment.",
            show_default=False,
        ),
    ] = None
    workload: Annotated[
        CheckWorkload | None,
        typer.Option(
            help="synthetic: samples of the model; tokens: a language model's token-normalised step "
            "and its controls (default: tokens when the plan's loss normalisation is token).",
            show_default=False,
        ),
    ] = None
    noise_steps: Annotated[
        int | None,
        typer.Option(
            help=f"Steps that measure the gradient noise scale (default: {DEFAULT_NOISE_STEPS} for a "
            "registered model or factory, else 0).",
            show_default=False,
        ),
    ] = None
    noise_lr: Annotated[
        float | None,
        typer.Option(help="SGD learning rate between those steps (default: 0).", show_default=False),
    ] = None
    fit_micro_batch: Annotated[
        bool,
        typer.Option(
            "--fit-micro-batch", help="Find the largest micro-batch that fits one device; re-plan with it."
        ),
    ] = False
    fit_memory_bytes: Annotated[
        int | None,
        typer.Option(
            help="The device memory to fit into (needed on CPU; implies --fit-micro-batch).",
            show_default=False,
        ),
    ] = None
    safety_margin: Annotated[
        float | None,
        typer.Option(
            help="Fraction of that memory kept free (default: 0.1 on a GPU, 0.15 on CPU).", show_default=False
        ),
    ] = None
    lr_scaling: Annotated[
        int | None,
        typer.Option(
            metavar="SAMPLES",
            help="An lr-scaling probe: train the base batch and each rule's lr at the global batch over "
            "SAMPLES samples and say which rule keeps the loss of the base run (docs/lr-scaling.md).",
            show_default=False,
        ),
    ] = None
    lr_rules: Annotated[
        str | None,
        typer.Option(
            help="With --lr-scaling: the rules, comma-separated (default: none,sqrt,linear and the plan's).",
            show_default=False,
        ),
    ] = None
    label_noise: Annotated[
        float | None,
        typer.Option(
            help="With --lr-scaling: Gaussian noise on the built-in model's targets (its noise knob).",
            show_default=False,
        ),
    ] = None


def check_body(request: Path | None, flags: PlanFlags, run: CheckFlags) -> Json:
    """A check request: --request holds a plan request or a whole check request."""
    if request is None:
        body: Json = {"plan": plan_body(flags)}
    else:
        data = plan_request(request, flags)
        body = data if "plan" in data else {"plan": data}
    for key, value in (("backend", run.backend), ("dtype", run.dtype), ("seed", run.seed)):
        if value is not None:
            body[key] = value
    if run.timeout is not None:
        body["timeout_s"] = run.timeout
    if run.steps is not None:
        body["steps"] = run.steps
    if run.resume_at is not None:
        body["resume"] = _check_resume(body, run.resume_at, flags.resume_replicas)
    if run.model is not None:
        body["model"] = run.model
    if run.workload is not None:
        body["workload"] = run.workload
    if run.noise_steps is not None or run.noise_lr is not None:
        noise = body.setdefault("noise_scale", {})
        if run.noise_steps is not None:
            noise["steps"] = run.noise_steps
        if run.noise_lr is not None:
            noise["learning_rate"] = run.noise_lr
    if run.fit_micro_batch or run.fit_memory_bytes is not None:
        fit = body.setdefault("fit_micro_batch", {})
        if run.fit_memory_bytes is not None:
            fit["memory_bytes"] = run.fit_memory_bytes
        if run.safety_margin is not None:
            fit["safety_margin"] = run.safety_margin
    if run.lr_scaling is not None:
        probe = body.setdefault("lr_scaling", {})
        probe["samples"] = run.lr_scaling
        if run.lr_rules is not None:
            probe["rules"] = [r.strip() for r in run.lr_rules.split(",") if r.strip()]
        if run.label_noise is not None:
            probe["label_noise"] = run.label_noise
    return body


def _check_resume(body: Json, at_step: int, replicas: int | None) -> Json:
    """--resume-at with --resume-replicas: the check's resume, not the plan's (which --resume-step
    asks for; the two would say different things)."""
    plan_resume = body["plan"].pop("resume", {})
    if replicas is None or set(plan_resume) - {"data_parallel_size"}:
        fail(
            {
                "detail": "a resume check takes --resume-at K --resume-replicas W2 (where the run stops, and "
                "on how many replicas it goes on), without --resume-step or --resume-samples"
            }
        )
    return {"at_step": at_step, "data_parallel_size": replicas}


@with_flag_groups
def check(
    *,
    flags: PlanFlags,
    request: CheckRequestFile = None,
    run: CheckFlags,
    launcher: Annotated[
        Launcher, typer.Option(help="Local only: start the ranks directly, or under torchrun.")
    ] = "direct",
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
    lr_chart: Annotated[
        Path | None,
        typer.Option(
            help="With --lr-scaling: save the probe's chart (held-out loss per run) to this .png or .svg.",
            show_default=False,
        ),
    ] = None,
    chart: Annotated[
        Path | None,
        typer.Option(
            help="With --steps: save the run's chart (loss and lr per step) to this .png or .svg file.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Prove a plan with one real DDP step against a single-process gradient; with --steps N,
    a run of N optimizer steps of its recipe against a single-process run (--chart draws it).

    Exit status: 0 passed, 1 failed, 2 did not run (an error)."""
    body = check_body(request, flags, run)
    if run.model_factory and url:
        fail({"detail": "--model-factory runs your code here; a server runs only registered names (--model)"})
    # The model may come from --model or from --request's file: either beside a factory is
    # two models, and only one would run.
    model = body.get("model")
    if run.model_factory and model is not None and model != "synthetic":
        where = "--model" if run.model else f"the request file's model {model!r}"
        fail({"detail": f"give {where} (a registered name) or --model-factory, not both"})
    if url:
        done = _check_on_server(body, url, api_key, wait or (run.timeout or 120.0) + 60.0)
    else:
        done = _check_here(body, run, processes, launcher)
    status = show_check(done, as_json)
    if chart is not None:
        _save_chart(done, chart, url, api_key)
    if lr_chart is not None:
        save_lr_chart(done, lr_chart, url, api_key)
    raise typer.Exit(status)


def _save_chart(done: Json, path: Path, url: str | None, api_key: str | None) -> None:
    """The run's chart, from the server that ran it or drawn here; a check without a run has none."""
    result = done.get("result")
    if not isinstance(result, dict) or not result.get("trajectory"):
        fail({"detail": f"no chart written to {path}: the check has no run (give --steps above 1)"})
    if url:
        with client_errors(), make_client(url, api_key) as client:
            image = client.check_trajectory(str(done["id"]), chart_format(path))
    else:
        image = draw_chart(result, path)
    try:
        path.write_bytes(image)
    except OSError as err:
        fail({"detail": f"cannot write {path}: {err.strerror or err}"})
    typer.echo(f"wrote {path}", err=True)


def _check_on_server(body: Json, url: str, api_key: str | None, wait: float) -> Json:
    """Submit the check and wait for it, showing its phase; Ctrl-C cancels it on the server."""
    progress = Progress("check")
    with client_errors(), make_client(url, api_key) as client:

        def host() -> Json | None:
            with contextlib.suppress(BatchplanError):
                return client.host()
            return None

        phase = ServerPhase(host)
        job: Json = {}
        try:
            with progress:
                progress.show("planning", logged=False)  # the server plans while it admits the check
                job = client.submit_check(body)
                progress.label = f"check {job['id']}"
                return client.wait_check(
                    job["id"], timeout=wait, poll=0.25, on_progress=lambda job, _: progress.show(phase(job))
                )
        except CheckTimeout as err:
            fail({"detail": str(err)})
        except KeyboardInterrupt:
            if "id" in job:
                with contextlib.suppress(BatchplanError):
                    client.cancel_check(job["id"])
            typer.echo(f"{progress.label}: cancelled", err=True)
            raise typer.Exit(130) from None


def _check_here(body: Json, run: CheckFlags, processes: int | None, launcher: Launcher) -> Json:
    """Validate and plan as a server would, then run the ranks here, showing the phase."""
    progress = Progress("local check")
    try:
        with progress:
            progress.show("planning", logged=False)
            stored, replicas = prepare_local_check(body, run.model_factory)
            count = processes or min(replicas, 4)
            if not 1 <= count <= replicas:
                fail({"detail": f"--processes must be between 1 and the {replicas} replicas of the plan"})
            progress.label = f"local check ({count} processes)"
            done = run_local_check(
                stored,
                count,
                run.timeout or 120.0,
                progress.show,
                model_factory=run.model_factory,
                launcher=launcher,
            )
            progress.show(str(done.get("status")))
            return done
    except KeyboardInterrupt:
        typer.echo(f"{progress.label}: interrupted; its processes were stopped", err=True)
        raise typer.Exit(130) from None
