"""The one codec of the records that cross a process: the pipe between the pool and its ranks,
the job store (SQLite) and, between hosts, the TCPStore. A record (a dataclass) becomes JSON
values and comes back as the same record, read by its type hints; nothing is written by hand
per type.

Why this and not pickle or msgspec: what the store keeps is what GET /v1/checks/{id} serves,
so it must be JSON, and the rank program under torchrun must run where only torch and the
standard library are (no msgspec on a cluster node). One codec for the three boundaries keeps
one form on the wire: its bytes (`to_json`, `from_json`), never pickled on top.

A record's JSON is its fields in order, with three declarations a field or class may carry:
- `field(metadata=named("timings_s"))`: the field's key is another name;
- `field(metadata=FLAT)`: a record field whose keys stand in its parent's object (as the
  served result lays out its setup, layout and run); a None record writes each key as null
  and reads back as None;
- `derived: ClassVar[tuple[str, ...]]` on the class: properties written after the fields
  (verdicts the reader sees) and never read back, so they cannot disagree with the fields;
- `op: ClassVar[str]` on the class: written as the first key, and how a union of records
  (the pipe's messages) picks the record to read.
A key a record does not know is an error when it is read (derived keys are known, and
skipped): what crosses a process is exactly what was written, and a spec with a key
smuggled in (an import path, say) does not load.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from collections.abc import Callable, Hashable, Mapping
from functools import cache
from typing import Any, Literal, TypeVar, Union, cast

T = TypeVar("T")
Json = Any  # None, bool, int, float, str, list of Json, dict of str to Json

NAME = "codec_name"
FLAT = {"codec_flat": True}


def named(key: str) -> dict[str, str]:
    """Field metadata: the field's key in JSON."""
    return {NAME: key}


def encode(value: Any) -> Json:
    """`value` (a record, or what records hold) as JSON values."""
    kind = type(value)
    if value is None or kind in (str, int, float, bool):
        return value
    if dataclasses.is_dataclass(kind):
        return _record_encoder(kind)(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, str):  # a subclass: torch.__version__ is a TorchVersion
        return str(value)
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, (tuple, list)):
        return [encode(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    raise TypeError(f"the codec does not carry {kind.__name__} values")


def decode(hint: type[T] | Any, data: Json) -> T:
    """The value of type `hint` that `encode` wrote as `data`."""
    value: T = _decoder(cast(Hashable, hint))(data)
    return value


# Made once: json.dumps with any argument builds its encoder on every call. What the codec
# writes is a tree (no cycles to look for).
_WIRE = json.JSONEncoder(separators=(",", ":"), check_circular=False)
_TEXT = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"), check_circular=False)


def to_json(value: Any) -> bytes:
    """`value` as the JSON bytes that cross between this app's processes (the pipe, the
    TCPStore): ASCII, and every float as Python writes it, NaN included (a diverged
    gradient's error is one), since both ends read it with `from_json`."""
    return _WIRE.encode(encode(value)).encode()


def from_json(hint: type[T] | Any, data: bytes | str) -> T:
    """The value of type `hint` that `to_json` wrote as `data`."""
    value: T = decode(hint, json.loads(data))
    return value


def json_text(data: Json) -> str:
    """JSON values as HTTP serves them (and as the job store keeps a result, to serve it as it
    is): compact, characters as they are, and no NaN or Infinity, which are not JSON (a
    ValueError)."""
    return _TEXT.encode(data)


# ---------------------------------------------------------------------------------- records


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    name: str
    key: str
    flat: bool
    hint: Any
    default: Any  # dataclasses.MISSING when the field must be given


@cache
def _fields(kind: type) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(kind)
    out = []
    for f in dataclasses.fields(kind):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        flat = bool(f.metadata.get("codec_flat"))
        out.append(_Field(f.name, f.metadata.get(NAME, f.name), flat, hints[f.name], default))
    return tuple(out)


def _tag(kind: type) -> str | None:
    op = getattr(kind, "op", None)
    return op if isinstance(op, str) else None


@cache
def _record_encoder(kind: type) -> Callable[[Any], dict[str, Json]]:
    fields = _fields(kind)
    derived: tuple[str, ...] = getattr(kind, "derived", ())
    tag = _tag(kind)

    def write(value: Any) -> dict[str, Json]:
        out: dict[str, Json] = {"op": tag} if tag is not None else {}
        for f in fields:
            item = getattr(value, f.name)
            if f.flat:
                out.update(_flat_encoder(f.hint)(item))
            else:
                out[f.key] = encode(item)
        for name in derived:
            out[name] = encode(getattr(value, name))
        return out

    return write


def _flat_encoder(hint: Any) -> Callable[[Any], dict[str, Json]]:
    kind = _optional_record(hint)

    def write(item: Any) -> dict[str, Json]:
        if item is None:
            return dict.fromkeys(_keys(kind))
        return _record_encoder(kind)(item)

    return write


@cache
def _keys(kind: type) -> tuple[str, ...]:
    """Every key a record writes (a flattened record's included), in order."""
    keys: list[str] = []
    for f in _fields(kind):
        keys += _keys(_optional_record(f.hint)) if f.flat else [f.key]
    return (*keys, *getattr(kind, "derived", ()))


def _optional_record(hint: Any) -> type:
    """The record type of a flattened field (`R` or `R | None`)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] if _is_union(hint) else [hint]
    if len(args) != 1 or not dataclasses.is_dataclass(args[0]):
        raise TypeError(f"a flattened field holds one record type, not {hint!r}")
    kind: type = cast(type, args[0])
    return kind


@cache
def _record_decoder(kind: type, nested: bool = False) -> Callable[[Json], Any]:
    """`nested`: a flattened record, read from its parent's object (the parent checks the keys)."""
    plan = [(f, _decoder(f.hint), _flat_decoder(f.hint) if f.flat else None) for f in _fields(kind)]
    known = {*_keys(kind), "op"}

    def read(data: Json) -> Any:
        if not isinstance(data, Mapping):
            raise TypeError(f"{kind.__name__} is read from an object, not {type(data).__name__}")
        if not nested and not known.issuperset(data):
            raise TypeError(f"{kind.__name__} has no {sorted(set(data) - known)}")
        values: dict[str, Any] = {}
        for f, read_value, read_flat in plan:
            if read_flat is not None:
                values[f.name] = read_flat(data)
            elif f.key in data:
                values[f.name] = read_value(data[f.key])
            elif f.default is dataclasses.MISSING:
                raise KeyError(f"{kind.__name__} needs {f.key!r}")
        return kind(**values)

    return read


def _flat_decoder(hint: Any) -> Callable[[Mapping[str, Json]], Any]:
    kind = _optional_record(hint)
    optional = _is_union(hint)
    first = _keys(kind)[0]

    def read(data: Mapping[str, Json]) -> Any:
        if optional and data.get(first) is None:
            return None
        return _record_decoder(kind, nested=True)(data)

    return read


# ---------------------------------------------------------------------------------- the rest


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (Union, types.UnionType)


def _same(data: Json) -> Json:
    return data


@cache
def _decoder(hint: Any) -> Callable[[Json], Any]:
    if hint is Any or hint in (str, int, bool) or hint is type(None):
        return _same
    if hint is float:
        return lambda data: None if data is None else float(data)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _record_decoder(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint
    if typing.is_typeddict(hint):
        return _same
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return _same
    if _is_union(hint):
        return _union_decoder(args)
    if origin in (tuple, list):
        return _sequence_decoder(origin, args)
    if origin in (dict, Mapping, typing.Mapping) or hint is dict:
        read_value = _decoder(args[1]) if args else _same
        return lambda data: {k: read_value(v) for k, v in data.items()}
    raise TypeError(f"the codec does not read {hint!r}")


def _union_decoder(args: tuple[Any, ...]) -> Callable[[Json], Any]:
    options = [a for a in args if a is not type(None)]
    if len(options) == 1:
        read_one = _decoder(options[0])
        return lambda data: None if data is None else read_one(data)
    tagged = {_tag(a): _decoder(a) for a in options if isinstance(a, type) and _tag(a) is not None}
    if len(tagged) != len(options):
        raise TypeError(f"a union of {options!r} is read only when each is a record with an `op`")

    def read(data: Json) -> Any:
        if data is None:
            return None
        reader = tagged.get(data.get("op"))
        if reader is None:
            raise ValueError(f"unknown op {data.get('op')!r}")
        return reader(data)

    return read


def _sequence_decoder(origin: Any, args: tuple[Any, ...]) -> Callable[[Json], Any]:
    if origin is tuple and args and (len(args) != 2 or args[1] is not Ellipsis):
        readers = [_decoder(a) for a in args]  # a fixed-length tuple
        return lambda data: tuple(r(v) for r, v in zip(readers, data, strict=True))
    read_item = _decoder(args[0]) if args else _same
    return lambda data: origin(read_item(v) for v in data)
