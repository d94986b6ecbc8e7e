"""Option groups: a frozen dataclass whose fields are typer options, shared by several commands.

Typer reads a command's options from its signature. `with_flag_groups` rewrites that signature:
a keyword-only parameter annotated with such a dataclass stands for the dataclass's fields, in
its place, and the command is called with one instance built from them. So a group is declared
once, and `--help` lists its options exactly as if each command spelled them out.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, get_type_hints

Command = Callable[..., None]


def with_flag_groups(command: Command) -> Command:
    """`command` as typer should see it: each flag-group parameter spelled out as its fields."""
    signature = inspect.signature(command, eval_str=True)
    groups: dict[str, tuple[type[Any], list[str]]] = {}
    params: list[inspect.Parameter] = []
    for param in signature.parameters.values():
        group = param.annotation
        if not (isinstance(group, type) and dataclasses.is_dataclass(group)):
            params.append(param)
            continue
        hints = get_type_hints(group, include_extras=True)  # keeps the typer.Option in Annotated
        fields = dataclasses.fields(group)
        groups[param.name] = (group, [f.name for f in fields])
        params += [
            inspect.Parameter(f.name, param.kind, default=f.default, annotation=hints[f.name]) for f in fields
        ]

    def run(**values: Any) -> None:
        for name, (group, names) in groups.items():
            values[name] = group(**{n: values.pop(n) for n in names})
        command(**values)

    functools.update_wrapper(run, command, assigned=("__module__", "__name__", "__qualname__", "__doc__"))
    run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    return run
