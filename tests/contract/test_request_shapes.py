"""JSON that no HTTP schema read (the rank program's --request) in a shape the planner cannot
take: a required field left out, a choice that is not one, an unknown key. Each is refused at
its field with what to give, never a KeyError's traceback."""

from __future__ import annotations

from typing import Any

import pytest

from app.contract.request import check_request
from app.core.errors.domain import DomainError

TOPOLOGY = {"num_nodes": 1, "gpus_per_node": 1}
TOKENS = {"topology": TOPOLOGY, "micro_batch_size": 1, "sequence_length": 8, "loss_normalization": "token"}
CASES: list[tuple[dict[str, Any], str, str]] = [
    ({}, "/plan", "give the plan"),
    ({"plan": []}, "/plan", "plan must be a JSON object"),
    ({"plan": {"micro_batch_size": 1}}, "/plan/topology", "give topology"),
    ({"plan": {**TOKENS, "packing": {}}}, "/plan/packing/mode", "give mode"),
    ({"plan": {**TOKENS, "packing": {"mode": "zzz"}}}, "/plan/packing/mode", "rows, token_budget"),
    ({"plan": {"topology": TOPOLOGY, "recommend": {"train_tokens": 5}}}, "/plan/recommend/law", "give law"),
    (
        {"plan": {"topology": TOPOLOGY, "learning_rate": {"base_lr": 0.1, "rule": "cubic"}}},
        "/plan/learning_rate/rule",
        "linear",
    ),
    ({"plan": {"topology": TOPOLOGY, "divisibility": "loose"}}, "/plan/divisibility", "exact"),
    ({"plan": {"topology": TOPOLOGY, "parallelism": {"tensr": 2}}}, "/plan", "tensr"),
]


@pytest.mark.parametrize(("body", "pointer", "says"), CASES)
def test_a_malformed_plan_is_refused_at_its_field(body: dict[str, Any], pointer: str, says: str) -> None:
    with pytest.raises(DomainError) as refused:
        check_request(body)
    assert refused.value.pointer == pointer
    assert says in str(refused.value)
