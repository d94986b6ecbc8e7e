"""The HTTP models of GET /v1/host and GET /v1/check-models document the worker's own records
(app.contract.host): the same fields, null where the record allows None, so that the two are
never written apart (issue 36)."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import pytest
from pydantic import BaseModel

from app.contract.host import HostDescription, ModelDescription, ProcessDescription
from app.schemas.host import CheckModelOut, HostOut, HostProcessOut


def _nullable(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


def _record_fields(record: type) -> dict[str, bool]:
    hints = typing.get_type_hints(record)
    return {f.name: _nullable(hints[f.name]) for f in dataclasses.fields(record)}


def _model_fields(model: type[BaseModel], leave_out: tuple[str, ...] = ()) -> dict[str, bool]:
    return {
        name: _nullable(field.annotation)
        for name, field in model.model_fields.items()
        if name not in leave_out
    }


@pytest.mark.parametrize(
    ("record", "model", "leave_out"),
    [
        (HostDescription, HostOut, ("exposure",)),  # the web layer's own: where it listens
        (ModelDescription, CheckModelOut, ()),
        (ProcessDescription, HostProcessOut, ()),
    ],
)
def test_the_http_model_has_the_records_fields_and_nulls(
    record: type, model: type[BaseModel], leave_out: tuple[str, ...]
) -> None:
    assert _model_fields(model, leave_out) == _record_fields(record)
