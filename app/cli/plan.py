"""`batchplan plan`: the plan as a table, as JSON, or as any export."""

from __future__ import annotations

from typing import Annotated

import typer

from app.cli.compute import render
from app.cli.flag_groups import with_flag_groups
from app.cli.help_panels import OUTPUT
from app.cli.law_flags import LawFlags, with_law
from app.cli.options import ApiKey, Output, PlanExportFlags, PlanFlags, RequestFile, Url
from app.cli.output import emit
from app.cli.packing_flags import PackingFlags, with_packing
from app.cli.requests import plan_request
from app.core.exports.registry import EXPORTERS

VIEWS = ("table", "json")
FORMAT_HELP = f"Output: {', '.join(VIEWS)}, or an export format: {', '.join(EXPORTERS)}."


@with_flag_groups
def plan(
    *,
    flags: PlanFlags,
    law: LawFlags,
    packed: PackingFlags,
    request: RequestFile = None,
    url: Url = None,
    api_key: ApiKey = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help=FORMAT_HELP, rich_help_panel=OUTPUT)] = "table",
    as_json: Annotated[
        bool, typer.Option("--json", help="Same as --format json.", rich_help_panel=OUTPUT)
    ] = False,
    exports: PlanExportFlags,
    output: Output = None,
) -> None:
    """Plan a batch split: here with the core, or on a server with --url."""
    body = (
        plan_request(request, flags)
        if request is not None
        else with_packing(with_law(plan_request(None, flags), law, flags), packed)
    )
    emit(render("json" if as_json else fmt, body, exports.query(), url, api_key), output)
