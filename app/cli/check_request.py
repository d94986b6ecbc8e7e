"""The check request the `check` and `measure` commands send: the plan's flags (or --request's
file) with the check's own flags over them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import typer

from app.cli.errors import fail
from app.cli.help_panels import CHECK, OUTPUT, PROBE
from app.cli.local_check import Launcher
from app.cli.options import ApiKey, PlanFlags, Url
from app.cli.requests import plan_body, plan_request
from app.client import Json
from app.contract.check_options import DEFAULT_NOISE_STEPS, Backend, CheckWorkload, DType

CheckRequestFile = Annotated[
    Path | None,
    typer.Option(
        help="A JSON plan request, or a whole check request {plan, backend, ...}.", rich_help_panel=OUTPUT
    ),
]


@dataclass(frozen=True)
class CheckFlags:
    """What the check runs: they set the check request's fields over the plan's (and --request's)."""

    backend: Annotated[
        Backend | None,
        typer.Option(
            help="auto: NCCL with a GPU per rank, else gloo on CPU (default: auto).", rich_help_panel=CHECK
        ),
    ] = None
    dtype: Annotated[
        DType | None, typer.Option(help="Precision of the step (default: float64).", rich_help_panel=CHECK)
    ] = None
    seed: Annotated[
        int | None,
        typer.Option(
            help="The check's seed (default: 0): model weights, synthetic samples, and the "
            "shuffle when there is no dataset. The sampler's seed is --data-seed.",
            rich_help_panel=CHECK,
        ),
    ] = None
    timeout: Annotated[
        float | None, typer.Option(help="Kill the check after this many seconds.", rich_help_panel=CHECK)
    ] = None
    steps: Annotated[
        int | None,
        typer.Option(
            help="Optimizer steps (default 1: the first step's gradient). More train the plan's recipe "
            "and hold every step against a single-process run, with the run-level controls.",
            rich_help_panel=CHECK,
        ),
    ] = None
    resume_at: Annotated[
        int | None,
        typer.Option(
            help="With --steps: checkpoint the run after this many optimizer steps and resume it on "
            "--resume-replicas replicas (the plan re-made for them, the same global batch; at most "
            "the plan's replicas).",
            rich_help_panel=CHECK,
        ),
    ] = None
    model: Annotated[
        str | None,
        typer.Option(
            help="A check model by its registered name (BATCHPLAN_CHECK_MODELS; default: synthetic).",
            rich_help_panel=CHECK,
        ),
    ] = None
    model_factory: Annotated[
        str | None,
        typer.Option(
            help="Local only: train package.module:factory's (model, dataset, loss_fn) in this environment.",
            rich_help_panel=CHECK,
        ),
    ] = None
    workload: Annotated[
        CheckWorkload | None,
        typer.Option(
            help="synthetic: samples of the model; tokens: a language model's token-normalised step "
            "and its controls (default: tokens when the plan's loss normalisation is token).",
            rich_help_panel=CHECK,
        ),
    ] = None
    noise_steps: Annotated[
        int | None,
        typer.Option(
            help=f"Steps that measure the gradient noise scale (default: {DEFAULT_NOISE_STEPS} for a "
            "registered model or factory, else 0).",
            rich_help_panel=PROBE,
        ),
    ] = None
    noise_lr: Annotated[
        float | None,
        typer.Option(help="SGD learning rate between those steps (default: 0).", rich_help_panel=PROBE),
    ] = None
    fit_micro_batch: Annotated[
        bool,
        typer.Option(
            "--fit-micro-batch",
            help="Find the largest micro-batch that fits one device; re-plan with it.",
            rich_help_panel=CHECK,
        ),
    ] = False
    fit_memory_bytes: Annotated[
        int | None,
        typer.Option(
            help="The device memory to fit into (needed on CPU; implies --fit-micro-batch).",
            rich_help_panel=CHECK,
        ),
    ] = None
    safety_margin: Annotated[
        float | None,
        typer.Option(
            help="Fraction of that memory kept free (default: 0.1 on a GPU, 0.15 on CPU).",
            rich_help_panel=CHECK,
        ),
    ] = None
    lr_scaling: Annotated[
        int | None,
        typer.Option(
            metavar="SAMPLES",
            help="An lr-scaling probe: train the base batch and each rule's lr at the global batch over "
            "SAMPLES samples and say which rule keeps the loss of the base run (docs/lr-scaling.md).",
            rich_help_panel=PROBE,
        ),
    ] = None
    lr_rules: Annotated[
        str | None,
        typer.Option(
            help="With --lr-scaling: the rules, comma-separated (default: none,sqrt,linear and the plan's).",
            rich_help_panel=PROBE,
        ),
    ] = None
    label_noise: Annotated[
        float | None,
        typer.Option(
            help="With --lr-scaling: Gaussian noise on the built-in model's targets (its noise knob).",
            rich_help_panel=PROBE,
        ),
    ] = None
    lr_epochs: Annotated[
        float | None,
        typer.Option(
            help="An lr-scaling probe over EPOCHS passes of the plan's dataset (instead of --lr-scaling).",
            rich_help_panel=PROBE,
        ),
    ] = None
    lr_seeds: Annotated[
        int | None,
        typer.Option(
            help="The probe's seeds, each rule against its seed's base run (default 3). Without "
            "--lr-scaling or --lr-epochs, a probe of the plan's whole run.",
            rich_help_panel=PROBE,
        ),
    ] = None
    lr_tolerance: Annotated[
        float | None,
        typer.Option(
            help="How far above the base run's final loss a rule may end and hold (default 0.05 relative, "
            "0.02 nats). Without --lr-scaling or --lr-epochs, a probe of the plan's whole run.",
            rich_help_panel=PROBE,
        ),
    ] = None
    lr_tolerance_unit: Annotated[
        Literal["relative", "nats"] | None,
        typer.Option(
            help="relative (a loss falling towards zero) or nats (a cross-entropy; the tokens workload's "
            "default). Without --lr-scaling or --lr-epochs, a probe of the plan's whole run.",
            rich_help_panel=PROBE,
        ),
    ] = None


def check_body(request: Path | None, flags: PlanFlags, run: CheckFlags) -> Json:
    """A check request: --request holds a plan request or a whole check request."""
    if request is None:
        body: Json = {"plan": plan_body(flags)}
    else:
        data = plan_request(request, flags)
        body = data if "plan" in data else {"plan": data}
    given = {
        "backend": run.backend,
        "dtype": run.dtype,
        "seed": run.seed,
        "timeout_s": run.timeout,
        "steps": run.steps,
        "model": run.model,
        "workload": run.workload,
    }
    body |= {key: value for key, value in given.items() if value is not None}
    if run.resume_at is not None:
        body["resume"] = _check_resume(body, run.resume_at, flags.resume_replicas)
    _merge(body, "noise_scale", {"steps": run.noise_steps, "learning_rate": run.noise_lr})
    if run.fit_micro_batch or run.fit_memory_bytes is not None:
        fit = {"memory_bytes": run.fit_memory_bytes, "safety_margin": run.safety_margin}
        _merge(body, "fit_micro_batch", fit, always=True)
    probe = {
        "samples": run.lr_scaling,
        "epochs": run.lr_epochs,
        "seeds": run.lr_seeds,
        "tolerance": run.lr_tolerance,
        "tolerance_unit": run.lr_tolerance_unit,
    }
    # Any of these asks for a probe; with neither length, it trains the plan's whole run.
    if any(value is not None for value in probe.values()):
        rules = None if run.lr_rules is None else [r.strip() for r in run.lr_rules.split(",") if r.strip()]
        _merge(body, "lr_scaling", {**probe, "rules": rules, "label_noise": run.label_noise}, always=True)
    return body


def _merge(body: Json, key: str, flags: Json, *, always: bool = False) -> None:
    """The given flags into the request's object `key` (over --request's), made if need be."""
    given = {name: value for name, value in flags.items() if value is not None}
    if given or always:
        body.setdefault(key, {}).update(given)


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


@dataclass(frozen=True)
class JobFlags:
    """Where the check runs (here, or on --url's server) and how its finished job prints: the
    options both commands that run a check take (check, measure)."""

    launcher: Annotated[
        Launcher,
        typer.Option(help="Local only: start the ranks directly, or under torchrun.", rich_help_panel=CHECK),
    ] = "direct"
    processes: Annotated[
        int | None,
        typer.Option(
            help="Local only: rank processes (default: replicas, at most 4).", rich_help_panel=CHECK
        ),
    ] = None
    wait: Annotated[
        float | None,
        typer.Option(
            help="With --url: stop waiting after this many seconds (default: timeout + 60).",
            rich_help_panel=OUTPUT,
        ),
    ] = None
    url: Url = None
    api_key: ApiKey = None
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the finished job as JSON.", rich_help_panel=OUTPUT)
    ] = False
