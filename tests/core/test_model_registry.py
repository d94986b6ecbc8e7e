"""BATCHPLAN_CHECK_MODELS: names to factories, parsed without importing anything."""

from __future__ import annotations

import re

import pytest

from app.contract.model_registry import SYNTHETIC, parse_models, unknown_model


def test_entries_by_comma_or_whitespace() -> None:
    text = " mlp=pkg.models:mlp, big-one=pkg.sub.models:Factory.build\nquad=q:make "
    assert parse_models(text) == {
        "mlp": "pkg.models:mlp",
        "big-one": "pkg.sub.models:Factory.build",
        "quad": "q:make",
    }
    assert parse_models("") == {} and parse_models("  ,  ") == {}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("mlp", "name=package.module:factory"),
        ("1mlp=pkg:f", "a letter"),
        ("synthetic=pkg:f", "built-in"),
        ("mlp=pkg.models", "not package.module:factory"),
        ("mlp=pkg/models.py:f", "not package.module:factory"),
        ("mlp=pkg:f;rm -rf /", "not package.module:factory"),
        ("mlp=pkg:f,mlp=pkg:g", "registered twice"),
    ],
)
def test_bad_entries_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_models(text)


def test_unknown_names_list_the_registered_and_the_nearest() -> None:
    detail = unknown_model("mpl", ["mlp", "resnet"])
    assert f"registered: {SYNTHETIC}, mlp, resnet" in detail and "did you mean 'mlp'" in detail
    assert "did you mean" not in unknown_model("zzzzzz", ["mlp"])


def test_settings_refuse_a_bad_registry_at_startup(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from app.settings import Settings

    monkeypatch.setenv("BATCHPLAN_CHECK_MODELS", "mlp=app.worker.example_models:mlp")
    assert Settings().model_registry == {"mlp": "app.worker.example_models:mlp"}
    monkeypatch.setenv("BATCHPLAN_CHECK_MODELS", "mlp=not a target")
    with pytest.raises(ValidationError, match=r"not package\.module:factory"):
        Settings()
