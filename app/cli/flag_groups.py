"""Option groups: a frozen dataclass whose fields are typer options, shared by several commands.

Typer reads a command's options from its signature. `with_flag_groups` rewrites that signature:
a keyword-only parameter annotated with such a dataclass stands for the dataclass's fields, in
its place, and the command is called with one instance built from them. So a group is declared
once, and `--help` lists its options exactly as if each command spelled them out.
`Annotated[Group, Without("field", ...)]` offers a group less those fields: a command is not
offered a flag it has no use for, and the group keeps their defaults.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any, get_args, get_origin, get_type_hints

Command = Callable[..., None]


@dataclasses.dataclass(frozen=True)
class Without:
    """The fields of a flag group that a command does not offer (they keep their defaults)."""

    names: frozenset[str]

    def __init__(self, *names: str) -> None:
        object.__setattr__(self, "names", frozenset(names))


def _group(annotation: Any) -> tuple[Any, frozenset[str]]:
    """The dataclass a parameter's annotation names (or the annotation), and the fields left out."""
    if get_origin(annotation) is Annotated:
        group, *extras = get_args(annotation)
        left_out = frozenset().union(*(e.names for e in extras if isinstance(e, Without)))
        return group, left_out
    return annotation, frozenset()


def with_flag_groups(command: Command) -> Command:
    """`command` as typer should see it: each flag-group parameter spelled out as its fields."""
    signature = inspect.signature(command, eval_str=True)
    groups: dict[str, tuple[type[Any], list[str]]] = {}
    params: list[inspect.Parameter] = []
    for param in signature.parameters.values():
        group, left_out = _group(param.annotation)
        if not (isinstance(group, type) and dataclasses.is_dataclass(group)):
            params.append(param)
            continue
        hints = get_type_hints(group, include_extras=True)  # keeps the typer.Option in Annotated
        fields = [f for f in dataclasses.fields(group) if f.name not in left_out]
        missing = left_out - {f.name for f in dataclasses.fields(group)}
        if missing:
            raise TypeError(f"{group.__name__} has no {sorted(missing)}")
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
