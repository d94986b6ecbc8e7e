"""A finished check's charts saved to a file (`batchplan check --chart`, `--lr-chart`, `batchplan
measure --chart`): fetched from the server that ran the check (GET /v1/checks/{id}/<name>.png
or .svg), or drawn here from its result as the server draws it. One row of `CHARTS` a chart."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import typer

from app.cli.compute import make_client
from app.cli.errors import client_errors, fail
from app.client import Json


@dataclass(frozen=True)
class Chart:
    """A chart of a check's result: `name` is the result's key it draws and the server's chart."""

    draw: str  # the function of app.charts: (data, format, title) -> bytes
    title: Callable[[Json], str]  # of the data drawn
    missing: str  # why a check has none, and the flag that asks for it
    whole_result: bool = False  # draws the whole result (its controls beside), not result[name]


CHARTS: dict[str, Chart] = {
    "trajectory": Chart(
        "trajectory_chart",
        lambda result: f"{result['steps']} optimizer steps, {result['data_parallel_size']} replicas",
        "the check has no run (give --steps above 1)",
        whole_result=True,
    ),
    "throughput": Chart(
        "throughput_chart",
        lambda throughput: f"one replica's micro-step on {throughput['device']}",
        "the check measured no throughput (batchplan measure measures it)",
    ),
    "lr_scaling": Chart(
        "lr_scaling_chart",
        lambda probe: f"lr scaling to a global batch of {probe['global_batch_size']:,}",
        "the check ran no lr-scaling probe (give --lr-scaling)",
    ),
}


def chart_format(path: Path) -> Literal["png", "svg"]:
    return "svg" if path.suffix.lower() == ".svg" else "png"


def save_chart(name: str, done: Json, path: Path, url: str | None, api_key: str | None) -> None:
    """The finished job `done`'s chart `name` written to `path`, from the server at `url` that
    ran it or drawn here; a check whose result has none fails, saying which flag asks for it."""
    chart = CHARTS[name]
    result = done.get("result")
    if not isinstance(result, dict) or not result.get(name):
        fail({"detail": f"no chart written to {path}: {chart.missing}"})
    fmt = chart_format(path)
    image: bytes
    if url:
        with client_errors(), make_client(url, api_key) as client:
            image = client.check_chart(str(done["id"]), name, fmt)
    else:
        data: Any = result if chart.whole_result else result[name]
        from app import charts  # matplotlib loads only when a chart is asked for

        draw = getattr(charts, chart.draw)
        image = draw(data, fmt, chart.title(data))
    try:
        path.write_bytes(image)
    except OSError as err:
        fail({"detail": f"cannot write {path}: {err.strerror or err}"})
    typer.echo(f"wrote {path}", err=True)
