"""Every recorded answer of POST /v1/plans comes back byte for byte: status, every header in
order, body. The requests (documented examples, seeded random plans over every feature, broken
fields, malformed HTTP and JSON, body limits, API keys) and their answers are in
plans_golden.jsonl, written by tests/support/golden_plans.py, which says how to regenerate it
when an answer changes on purpose."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.golden_plans import APPS, build_app, load, replay

ENTRIES = load()


@pytest.fixture(scope="module")
def apps() -> dict[str, Any]:
    return {variant: build_app(variant) for variant in APPS}


def test_the_golden_set_covers_every_kind_of_answer() -> None:
    statuses = {entry["status"] for entry in ENTRIES}
    assert {200, 400, 401, 405, 413, 422} <= statuses
    assert sum(entry["status"] == 200 for entry in ENTRIES) >= 80
    assert {entry["app"] for entry in ENTRIES} == set(APPS)


@pytest.mark.parametrize("entry", ENTRIES, ids=[entry["name"] for entry in ENTRIES])
def test_answers_are_byte_identical(entry: dict[str, Any], apps: dict[str, Any]) -> None:
    again = replay(entry, apps[entry["app"]])
    assert (again["status"], again["headers"]) == (entry["status"], entry["headers"])
    assert again["body"] == entry["body"]
