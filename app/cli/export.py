"""`batchplan export FORMAT`: the plan written for a launcher or trainer."""

from __future__ import annotations

from typing import Annotated

import typer

from app.cli.compute import export_text
from app.cli.flag_groups import with_flag_groups
from app.cli.law_flags import LawFlags, with_law
from app.cli.options import ApiKey, ExportFlags, Output, PlanFlags, RequestFile, Url
from app.cli.output import emit
from app.cli.packing_flags import PackingFlags, with_packing
from app.cli.requests import plan_request
from app.core.exports.registry import EXPORTERS


@with_flag_groups
def export(
    fmt: Annotated[str, typer.Argument(metavar="FORMAT", help=", ".join(EXPORTERS))],
    *,
    flags: PlanFlags,
    law: LawFlags,
    packed: PackingFlags,
    request: RequestFile = None,
    url: Url = None,
    api_key: ApiKey = None,
    exports: ExportFlags,
    output: Output = None,
) -> None:
    """Write the plan for a launcher or trainer (as `plan --format FORMAT`)."""
    body = (
        plan_request(request, flags)
        if request is not None
        else with_packing(with_law(plan_request(None, flags), law, flags), packed)
    )
    emit(export_text(fmt, body, exports.query(), url, api_key), output)
