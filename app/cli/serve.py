"""`batchplan serve` runs the HTTP server; `batchplan host` asks one what its worker can run."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from app.cli.compute import make_client
from app.cli.errors import client_errors
from app.cli.options import ApiKey


def host(url: Annotated[str, typer.Option(help="A batchplan server.")], api_key: ApiKey = None) -> None:
    """What a server's worker can run (GET /v1/host), as JSON."""
    with client_errors(), make_client(url, api_key) as client:
        typer.echo(json.dumps(client.host(), indent=2))


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
