"""POST /v1/plans in tokens over HTTP: the `tokens` object, and bad token inputs as RFC 9457
problems that name the field and suggest values that plan."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.problems import assert_field_error

from app.schemas.examples import plan_example

TOP = {"topology": {"num_nodes": 1, "gpus_per_node": 8}}


def test_the_language_model_example_answers_with_tokens(client: TestClient) -> None:
    response = client.post("/v1/plans", json=plan_example("language_model"))
    assert response.status_code == 200, response.text
    body = response.json()
    seq = body["tokens"]["sequence_length"]
    assert body["tokens"]["tokens_per_step"] == body["global_batch_size"] * seq == 4194304
    assert body["tokens"]["tokens_per_micro_batch"] == body["micro_batch_size"] * seq == 8192
    assert body["tokens"]["unit"] == "tokens" and body["tokens"]["loss_normalization"] == "token"
    assert [g["loss_scale"] for g in body["replica_groups"]] == [None]
    assert body["learning_rate"]["base_batch_tokens"] == 1048576


BAD_TOKENS = [
    # (body, pointer, the suggestion key whose values must plan)
    (
        {**TOP, "sequence_length": 1000, "global_batch_tokens": 64500},
        "/global_batch_tokens",
        "global_batch_tokens",
    ),
    (
        {**TOP, "sequence_length": 1000, "global_batch_tokens": 64000, "micro_batch_tokens": 1500},
        "/micro_batch_tokens",
        "micro_batch_tokens",
    ),
    (
        {**TOP, "sequence_length": 1000, "global_batch_tokens": 12000, "micro_batch_tokens": 1000},
        "/global_batch_tokens",
        "global_batch_tokens",
    ),
    ({**TOP, "global_batch_tokens": 64000}, "/sequence_length", None),
    ({**TOP, "sequence_length": 0, "global_batch_size": 8}, "/sequence_length", None),
    (
        {**TOP, "sequence_length": 10, "global_batch_size": 8, "loss_normalization": "tokens"},
        "/loss_normalization",
        None,
    ),
]


@pytest.mark.parametrize(("body", "pointer", "key"), BAD_TOKENS)
def test_bad_token_inputs_are_problems_naming_the_field(
    client: TestClient, body: dict[str, Any], pointer: str, key: str | None
) -> None:
    problem = assert_field_error(client.post("/v1/plans", json=body), pointer)
    if key is None:
        return
    suggested = problem["suggestions"][key]
    assert suggested
    for value in suggested:
        fixed = client.post("/v1/plans", json={**body, key: value})
        assert fixed.status_code == 200, fixed.text
