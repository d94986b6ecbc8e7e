"""`batchplan check`: prove a plan with one real DDP step (or a run of --steps), on a server
(--url) or here."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from app.cli.charts import save_chart
from app.cli.check_request import CheckFlags, CheckRequestFile, JobFlags, check_body
from app.cli.compute import make_client
from app.cli.errors import client_errors, fail
from app.cli.flag_groups import with_flag_groups
from app.cli.help_panels import CHECK, PROBE
from app.cli.local_check import Launcher, prepare_local_check, run_local_check
from app.cli.options import PlanFlags
from app.cli.output import show_check
from app.cli.progress import Progress, ServerPhase
from app.client import BatchplanError, CheckTimeout, Json


# A typer command: each parameter is one of its options.
@with_flag_groups
def check(
    *,
    flags: PlanFlags,
    request: CheckRequestFile = None,
    run: CheckFlags,
    job: JobFlags,
    lr_chart: Annotated[
        Path | None,
        typer.Option(
            help="With --lr-scaling: save the probe's chart (held-out loss per run) to this .png or .svg.",
            rich_help_panel=PROBE,
        ),
    ] = None,
    chart: Annotated[
        Path | None,
        typer.Option(
            help="With --steps: save the run's chart (loss and lr per step) to this .png or .svg file.",
            rich_help_panel=CHECK,
        ),
    ] = None,
) -> None:
    """Prove a plan with one real DDP step against a single-process gradient; with --steps N,
    a run of N optimizer steps of its recipe against a single-process run (--chart draws it).

    Exit status: 0 passed, 1 failed (or --lr-scaling found that the plan's own lr rule does not
    hold), 2 did not run (an error)."""
    body = check_body(request, flags, run)
    if run.model_factory and job.url:
        fail({"detail": "--model-factory runs your code here; a server runs only registered names (--model)"})
    # The model may come from --model or from --request's file: either beside a factory is
    # two models, and only one would run.
    model = body.get("model")
    if run.model_factory and model is not None and model != "synthetic":
        where = "--model" if run.model else f"the request file's model {model!r}"
        fail({"detail": f"give {where} (a registered name) or --model-factory, not both"})
    done = run_check(body, run, job)
    status = show_check(done, job.as_json)
    if chart is not None:
        save_chart("trajectory", done, chart, job.url, job.api_key)
    if lr_chart is not None:
        save_chart("lr_scaling", done, lr_chart, job.url, job.api_key)
    raise typer.Exit(status)


def run_check(body: Json, run: CheckFlags, job: JobFlags) -> Json:
    """The check `body` asks for, on --url's server or here: its finished job."""
    if job.url:
        return _check_on_server(body, job.url, job.api_key, job.wait or (run.timeout or 120.0) + 60.0)
    return _check_here(body, run, job.processes, job.launcher)


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
