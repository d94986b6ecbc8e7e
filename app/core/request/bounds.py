"""A table of limits (a field's path -> its bounds) and the check of JSON against one: what
app.core.request.limits writes the plan request's ranges in, and app.contract.limits the
check request's. A path is the field's dotted JSON path, `[]` for a list's items
(`topology.node_groups[].num_nodes`)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from app.core.errors.domain import InvalidValue, field_key


@dataclass(frozen=True, slots=True)
class Bounds:
    """What a field takes. `kind`: a whole number ("int"), a finite number ("float"), or a list
    whose number of items the bounds hold ("items"). Each bound keeps the type it is written
    with: the OpenAPI document states `maximum: 1000000.0` for a float."""

    kind: Literal["int", "float", "items"]
    ge: int | float | None = None
    gt: int | float | None = None
    le: int | float | None = None
    lt: int | float | None = None
    allow_null: bool = False  # null (the field's default) is accepted

    @property
    def nullable(self) -> Bounds:
        return Bounds(self.kind, self.ge, self.gt, self.le, self.lt, allow_null=True)

    def holds(self, number: float) -> bool:
        return not (
            (self.ge is not None and number < self.ge)
            or (self.gt is not None and number <= self.gt)
            or (self.le is not None and number > self.le)
            or (self.lt is not None and number >= self.lt)
        )

    def describe(self) -> str:
        """What the field takes: "a whole number from 1 to 64", "a list of 1 to 64 items"."""
        if self.kind == "items":
            return f"a list of {self._range(plain=True)} items"
        return f"{'a whole number' if self.kind == 'int' else 'a finite number'} {self._range()}"

    def _range(self, *, plain: bool = False) -> str:
        if self.ge is not None and self.ge == self.le:
            return f"exactly {self.ge}"
        if self.ge is not None and self.le is not None:
            return f"{'' if plain else 'from '}{self.ge} to {self.le}"
        said = (("at least", self.ge), ("above", self.gt), ("at most", self.le), ("below", self.lt))
        return " and ".join(f"{word} {bound}" for word, bound in said if bound is not None)

    def nearest(self, number: float) -> int | None:
        """The nearest valid whole number to `number`, where there is one to suggest: a count's
        nearest in its range; a float's inclusive bound when it is whole (no lr is "1")."""
        if self.kind == "int":
            low = self.ge if self.ge is not None else None if self.gt is None else self.gt + 1
            high = self.le if self.le is not None else None if self.lt is None else self.lt - 1
            near: float = number if low is None else max(number, low)
            near = near if high is None else min(near, high)
        elif self.ge is not None and number < self.ge:
            near = self.ge
        elif self.le is not None and number > self.le:
            near = self.le
        else:
            return None
        if not (math.isfinite(near) and float(near).is_integer() and self.holds(near)):
            return None
        return int(near)


class Limits(Mapping[str, Bounds]):
    """A table of limits: a field's path -> its bounds, and the check of JSON against it."""

    def __init__(self, table: Mapping[str, Bounds]) -> None:
        self._table = dict(table)
        self._tree = _Node()
        for path, bounds in self._table.items():
            node = self._tree
            for part in path.replace("[]", ".[]").split("."):
                node = node.children.setdefault(part, _Node())
            node.bounds = bounds

    def __getitem__(self, path: str) -> Bounds:
        return self._table[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def under(self, prefix: str) -> dict[str, Bounds]:
        """The table with each path under `prefix` (a plan request nested in a check's `plan`)."""
        return {f"{prefix}.{path}": bounds for path, bounds in self._table.items()}

    def check(self, data: Any) -> Any:
        """`data` with every field of the table held to its bounds, as the HTTP schema holds
        them: a whole number given as a float (`2.0`) comes back an int, a number where a float
        goes a float. Raises InvalidValue at the first field outside, with its nearest value."""
        return _walk(data, self._tree, "")


class _Node:
    __slots__ = ("bounds", "children")

    def __init__(self) -> None:
        self.bounds: Bounds | None = None
        self.children: dict[str, _Node] = {}


def _walk(value: Any, node: _Node, pointer: str) -> Any:
    if node.bounds is not None:
        value = _held(value, node.bounds, pointer)
    if value is None or not node.children:
        return value
    items = node.children.get("[]")
    if items is not None:
        if not isinstance(value, list):
            raise InvalidValue(f"{_name(pointer)} must be a list", pointer=pointer)
        walked = [_walk(v, items, f"{pointer}/{i}") for i, v in enumerate(value)]
        return value if all(map(_same, walked, value)) else walked
    if not isinstance(value, Mapping):
        raise InvalidValue(f"{_name(pointer) or 'the body'} must be a JSON object", pointer=pointer)
    changed = {}
    for key, child in node.children.items():
        if key in value:
            walked = _walk(value[key], child, f"{pointer}/{key}")
            if not _same(walked, value[key]):
                changed[key] = walked
    return {**value, **changed} if changed else value


def _same(walked: Any, given: Any) -> bool:
    """Whether the walk left a value as given: a container is the same object, a number the
    same type and value (a count's `2.0` comes back `2`, equal but changed)."""
    return walked is given or (type(walked) is type(given) in (int, float) and walked == given)


def _name(pointer: str) -> str:
    return pointer.rsplit("/", 1)[1] if pointer else ""


def _held(value: Any, bounds: Bounds, pointer: str) -> Any:
    """`value` as the field takes it, or InvalidValue naming the field and what it takes."""
    name = _name(pointer)
    if value is None:
        if bounds.allow_null:
            return None
        raise InvalidValue(f"{name} must be {bounds.describe()}, not null", pointer=pointer)
    if bounds.kind == "items":
        if not isinstance(value, list):
            raise InvalidValue(f"{name} must be {bounds.describe()}", pointer=pointer)
        if not bounds.holds(len(value)):
            # A list of one length is a tuple in the schema, which names the first item missing.
            short = bounds.ge is not None and bounds.ge == bounds.le and len(value) < bounds.ge
            at = f"{pointer}/{len(value)}" if short else pointer
            raise InvalidValue(f"{name} must be {bounds.describe()}, not {len(value)}", pointer=at)
        return value
    number = _number(value, bounds.kind)
    if number is None or not bounds.holds(number):
        near = None if number is None else bounds.nearest(number)
        raise InvalidValue(
            f"{name} must be {bounds.describe()}, not {value!r}",
            pointer=pointer,
            suggestions={field_key(pointer): [near]} if near is not None else {},
        )
    return number


def _number(value: Any, kind: str) -> int | float | None:
    """A JSON number as the field's kind takes it (a whole float for a count, as the schema
    reads `2.0`), or None: a boolean or a string is no number, even where Python converts it."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if kind == "int":
        if isinstance(value, float):
            return int(value) if value.is_integer() else None
        return value
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
