"""`batchplan measure`: a check with `throughput` (issue 38), on a server (--url) or here: the
table of one replica's micro-step at each micro-batch, and its chart (--chart)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from app.cli.charts import save_chart
from app.cli.check import run_check
from app.cli.check_request import CheckFlags, CheckRequestFile, JobFlags, check_body
from app.cli.errors import fail
from app.cli.flag_groups import Without, with_flag_groups
from app.cli.help_panels import MEASURE
from app.cli.options import PlanFlags
from app.cli.output import show_check
from app.cli.throughput_table import curve_lines
from app.client import Json


@dataclass(frozen=True)
class MeasureFlags:
    """The measurement: they set the check request's `throughput`."""

    micro_batch_sizes: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated, increasing: 1,2,4,8 (default: powers of two up to the plan's cap, "
            "else up to 128).",
            rich_help_panel=MEASURE,
        ),
    ] = None
    repeats: Annotated[
        int | None,
        typer.Option(help="Timed repeats per size; the median counts (default 10).", rich_help_panel=MEASURE),
    ] = None
    # --warmup-steps is the plan's lr warmup; this is the request's throughput.warmup_steps.
    measure_warmup_steps: Annotated[
        int | None,
        typer.Option(
            help="Untimed micro-steps before each size's repeats (default 3).", rich_help_panel=MEASURE
        ),
    ] = None
    time_optimizer_step: Annotated[
        bool,
        typer.Option(
            "--time-optimizer-step", help="Time an AdamW step with each micro-step.", rich_help_panel=MEASURE
        ),
    ] = False
    margin: Annotated[
        float | None,
        typer.Option(
            help="The knee: within this fraction of the fastest samples/s (default 0.05).",
            rich_help_panel=MEASURE,
        ),
    ] = None


def measure_body(request: Path | None, flags: PlanFlags, run: CheckFlags, measure: MeasureFlags) -> Json:
    body = check_body(request, flags, run)
    throughput: Json = body.setdefault("throughput", {})
    if measure.micro_batch_sizes is not None:
        try:
            throughput["micro_batch_sizes"] = [
                int(b) for b in measure.micro_batch_sizes.split(",") if b.strip()
            ]
        except ValueError:
            fail(
                {
                    "detail": f"--micro-batch-sizes {measure.micro_batch_sizes!r}: "
                    "give whole numbers, e.g. 1,2,4,8"
                }
            )
    for key, value in (
        ("repeats", measure.repeats),
        ("warmup_steps", measure.measure_warmup_steps),
        ("margin", measure.margin),
    ):
        if value is not None:
            throughput[key] = value
    if measure.time_optimizer_step:
        throughput["time_optimizer_step"] = True
    return body


COLD_RANKS = (
    "measured on ranks this command started (cold: fresh processes, caches and allocator): expect "
    "slower steps and a wider spread than a server's warm ranks; measure on a server (--url), or "
    "with more --measure-warmup-steps"
)

# A measurement times one replica's micro-steps: a resume, the lr-scaling probe (run or read)
# and the noise scale's steps would not change it, so `measure` does not offer their flags.
NOT_MEASURED = Without(
    "resume_step", "resume_samples", "resume_replicas", "lr_scaling_result", "lr_scaling_check"
)
NOT_MEASURED_CHECK = Without(
    "resume_at",
    "noise_steps",
    "noise_lr",
    "lr_scaling",
    "lr_rules",
    "label_noise",
    "lr_epochs",
    "lr_seeds",
    "lr_tolerance",
    "lr_tolerance_unit",
)


# A typer command: each parameter is one of its options.
@with_flag_groups
def measure(
    *,
    flags: Annotated[PlanFlags, NOT_MEASURED],
    request: CheckRequestFile = None,
    run: Annotated[CheckFlags, NOT_MEASURED_CHECK],
    sizes: MeasureFlags,
    job: JobFlags,
    chart: Annotated[
        Path | None,
        typer.Option(
            help="Save the curve's chart (samples/s per micro-batch) to this .png or .svg file.",
            rich_help_panel=MEASURE,
        ),
    ] = None,
) -> None:
    """Measure one replica's throughput at each micro-batch size after a check of the plan: the
    table, the fastest micro-batch and the knee, and the curve a plan request takes.

    Exit status: 0 measured (and the check passed), 1 the check failed, 2 did not run."""
    body = measure_body(request, flags, run, sizes)
    if run.model_factory and job.url:
        fail({"detail": "--model-factory runs your code here; a server runs only registered names (--model)"})
    done = run_check(body, run, job)
    result = done.get("result") if done.get("status") == "succeeded" else None
    if not isinstance(result, dict) or not result.get("throughput"):
        raise typer.Exit(show_check(done, job.as_json))
    if not job.url:
        # Measured here, on ranks this command just started: the server's are warm.
        result["throughput"].setdefault("warnings", []).append(COLD_RANKS)
    if job.as_json:
        status = show_check(done, True)
    else:
        status = 0 if result.get("passed") else 1
        verdict = "passed" if status == 0 else "FAILED (`batchplan check` shows why)"
        typer.echo("\n".join([*curve_lines(result["throughput"]), f"the check of the plan {verdict}"]))
    if chart is not None:
        save_chart("throughput", done, chart, job.url, job.api_key)
    raise typer.Exit(status)
