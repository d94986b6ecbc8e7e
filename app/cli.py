"""The `batchplan` command: plan locally with the core, or against a server with --url."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from app.core.errors import PlanError
from app.core.models import Divisibility, LossReduction, LRRule, Optimizer
from app.core.planner import plan as plan_locally
from app.schemas.plans import PlanOut, PlanRequestIn

cli = typer.Typer(
    help="Split a distributed PyTorch batch exactly.", no_args_is_help=True, add_completion=False
)


def _request_body(**flags: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "topology": {"num_nodes": flags["num_nodes"], "gpus_per_node": flags["gpus_per_node"]}
    }
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
            "seed": flags["seed"],
        }
        if flags["epochs"] is not None:
            body["dataset"]["epochs"] = flags["epochs"]
    if flags["base_lr"] is not None:
        lr: dict[str, Any] = {
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


def _fail(problem: dict[str, Any]) -> None:
    typer.echo(f"error: {problem.get('detail', problem.get('title', 'request failed'))}", err=True)
    for item in problem.get("errors", [])[1:]:
        typer.echo(f"  {item['pointer']}: {item['detail']}", err=True)
    for field, values in (problem.get("suggestions") or {}).items():
        typer.echo(f"  try {field}: {', '.join(map(str, values))}", err=True)
    raise typer.Exit(2)


def compute(body: dict[str, Any], url: str | None) -> dict[str, Any]:
    """The plan as JSON, identical whether computed here or by a server."""
    if url:
        import httpx

        response = httpx.post(url.rstrip("/") + "/v1/plans", json=body, timeout=30)
        data: dict[str, Any] = response.json()
        if response.status_code != 200:
            _fail(data)
        return data
    try:
        request = PlanRequestIn.model_validate(body)
        return PlanOut.model_validate(plan_locally(request.to_core())).model_dump(mode="json")
    except ValidationError as err:
        first = err.errors()[0]
        _fail({"detail": f"/{'/'.join(map(str, first['loc']))}: {first['msg']}"})
    except PlanError as err:
        _fail({"detail": err.detail, "suggestions": err.suggestions})
    raise AssertionError("unreachable")


def _table(result: dict[str, Any]) -> str:
    lines = [
        f"world size {result['world_size']}, model-parallel {result['model_parallel_size']}, "
        f"data-parallel {result['data_parallel_size']}",
        f"global batch {result['global_batch_size']} (asked {result['requested_global_batch_size']}), "
        f"micro {result['micro_batch_size']}, accumulation {result['gradient_accumulation_steps']}",
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
    lines += [""] + [f"warning: {w}" for w in result["warnings"]]
    lines += [f"- {e}" for e in result["explanation"]]
    return "\n".join(lines).rstrip()


@cli.command()
def plan(
    num_nodes: Annotated[int, typer.Option(help="Nodes in the cluster.")] = 1,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node.")] = 8,
    global_batch_size: Annotated[int | None, typer.Option("--global-batch-size", "-b")] = None,
    micro_batch_size: Annotated[int | None, typer.Option("--micro-batch-size", "-m")] = None,
    gradient_accumulation_steps: Annotated[int | None, typer.Option("--accumulation", "-g")] = None,
    max_micro_batch_size: Annotated[int | None, typer.Option(help="Micro-batch cap per GPU.")] = None,
    divisibility: Divisibility = Divisibility.EXACT,
    loss_reduction: LossReduction = LossReduction.MEAN,
    tensor: int = 1,
    pipeline: int = 1,
    context: int = 1,
    num_samples: Annotated[int | None, typer.Option(help="Dataset size (adds the sampler).")] = None,
    drop_last: bool = False,
    no_shuffle: bool = False,
    seed: int = 0,
    epochs: int | None = None,
    base_lr: Annotated[float | None, typer.Option(help="Adds the learning rate.")] = None,
    base_batch_size: int = 256,
    rule: LRRule = LRRule.AUTO,
    optimizer: Optimizer = Optimizer.SGD,
    warmup_epochs: float | None = None,
    warmup_steps: int | None = None,
    request: Annotated[Path | None, typer.Option(help="A JSON plan request (overrides flags).")] = None,
    url: Annotated[str | None, typer.Option(help="A batchplan server, e.g. http://127.0.0.1:8000")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Plan a batch split (locally with the core, or on a server with --url)."""
    if request is not None:
        body = json.loads(request.read_text())
    else:
        body = _request_body(**{k: v for k, v in locals().items() if k not in ("request", "url", "as_json")})
    result = compute(body, url)
    typer.echo(json.dumps(result, indent=2) if as_json else _table(result))


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
