"""The `batchplan` command: plan, export and check locally with the core, or against a server with --url.

Local and server answers are the same JSON; errors are the server's problem+json in both
cases (the local path builds them with the server's own functions), printed as the detail,
the other field errors and the suggestions, with exit status 2.

One module per command: plan, export, check (local_check runs one here), measure (a check's
throughput curve), serve (with host).
options.py declares the shared options once (as groups, see flag_groups.py), requests.py turns
them into a plan request, compute.py answers plan and export here or via a server,
progress.py shows the phase of a running check on stderr, help_panels.py groups `--help`, and
output.py prints results and problems.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer

from app.cli import check, export, measure, plan, serve
from app.cli.flag_names import FlagCommand

# Click's plain help, not rich's: rich's table cuts option names to fit 80 columns
# ("--global-batch-s…"), click's never cuts a name (tests/cli/test_help_and_flags.py); its
# sections group the options (help_panels.py).
cli = typer.Typer(
    help="Split a distributed PyTorch batch exactly.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},
)


def _version(asked: bool) -> None:
    if asked:
        try:
            typer.echo(f"batchplan {version('batchplan')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            typer.echo("batchplan (not installed: no version)")
        raise typer.Exit(0)


@cli.callback()
def _options(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Split a distributed PyTorch batch exactly."""


for command in (plan.plan, export.export, check.check, measure.measure, serve.host, serve.serve):
    cli.command(cls=FlagCommand)(command)


def main() -> None:
    cli(prog_name="batchplan")


__all__ = ["cli", "main"]
