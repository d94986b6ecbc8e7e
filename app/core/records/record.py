"""`record`: how the core declares its value types (requests, plans and every part of them).

A record is a slotted dataclass whose fields the type checker holds read-only, with the hash
and equality `dataclass(frozen=True)` gives. It is not `frozen=True` at run time because a
frozen dataclass's `__init__` sets every field through `object.__setattr__`: about 95 ns a
field against 13 ns for a plain slot store (Python 3.11). A plan builds some 170 fields of
records, and that was 15 of the ~80 us the app spends on a POST /v1/plans
(bench/bench_instructions.py and a py-spy profile of the fast path; issue 26).

What frozen=True guarded is kept where it is checked: `dataclass_transform(frozen_default=True)`
makes mypy reject an assignment to any field of a record (CI runs mypy; tests/core/
test_records.py holds that), and `dataclasses.replace` is how the core derives one record
from another. Nothing in the app assigns to a record's field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def record(cls: type[T]) -> type[T]:
    return dataclass(slots=True, unsafe_hash=True)(cls)
