"""POST /v1/plans with `packing` over HTTP: packed rows and token budgets in the answer's
`tokens` (what varies, the bounds counted as the collator counts, the exact scale with the
plan's numbers), the tools' warnings, and bad packing as problems naming the field."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.apps import runner_client
from support.fake_runner import FakeRunner
from support.problems import assert_field_error

BASE: dict[str, Any] = {
    "topology": {"num_nodes": 1, "gpus_per_node": 4},
    "global_batch_size": 32,
    "micro_batch_size": 2,
    "sequence_length": 512,
    "loss_normalization": "token",
}


def _plan(client: TestClient, **fields: Any) -> dict[str, Any]:
    response = client.post("/v1/plans", json={**BASE, **fields})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def _rows(lengths: list[int], seq: int) -> list[list[int]]:
    """Documents packed in order into rows of seq positions, a document cut at a row's end
    going on as a new piece: each row's pieces."""
    rows: list[list[int]] = [[]]
    for length in lengths:
        left = length
        while left:
            room = seq - sum(rows[-1])
            if not room:
                rows.append([])
                room = seq
            piece = min(room, left)
            rows[-1].append(piece)
            left -= piece
    return rows


def _budgeted(lengths: list[int], budget: int) -> list[list[int]]:
    """Samples filled in order into micro-batches of at most `budget` tokens."""
    batches: list[list[int]] = [[]]
    for length in lengths:
        if sum(batches[-1]) + length > budget:
            batches.append([])
        batches[-1].append(length)
    return batches


def test_packed_rows_bound_the_targets_as_the_collator_counts_them(client: TestClient) -> None:
    seq, longest = 512, 200
    body = _plan(client, packing={"mode": "rows", "document_length": {"mean": 120, "max": longest}})
    tokens = body["tokens"]
    assert tokens["packing"] == "rows" and tokens["varies"]
    # A full row holds at least ceil(512 / 200) = 3 documents: 509 targets; 32 rows a step.
    assert tokens["max_valid_targets_per_step"] == 32 * (seq - 3)
    assert tokens["max_micro_batches_per_step"] == body["gradient_accumulation_steps"] == 4
    assert "x 4 (data_parallel_size)" in tokens["loss_scale_formula"]
    assert str(32 * (seq - 3)) in tokens["loss_scale_formula"]
    rng = random.Random(0)
    for _ in range(50):  # seeded random documents never pass the bound, row by row
        rows = _rows([rng.randint(1, longest) for _ in range(200)], seq)
        assert max(sum(row) - len(row) for row in rows) <= seq - 3
    warnings = " ".join(body["warnings"])
    for named in ("average_tokens_across_devices", "--calculate-per-token-loss", "use_cache=False", "#2318"):
        assert named in warnings
    assert any("Packed rows" in line for line in body["explanation"])


def test_without_document_lengths_a_row_has_at_most_one_document() -> None:
    # Documents cut to rows: a row holding one document has seq - 1 targets.
    assert max(sum(r) - len(r) for r in _rows([10_000], 512)) == 511


def test_a_token_budget_bounds_the_micro_batches_a_rank_runs(client: TestClient) -> None:
    seq, budget = 512, 1536
    body = _plan(client, packing={"mode": "token_budget", "max_tokens_per_micro_batch": budget})
    tokens = body["tokens"]
    per_rank = 32 // 4
    # Each micro-batch but the last holds more than 1536 - 512 tokens of at most 8 x 512: at most 4.
    assert tokens["max_micro_batches_per_step"] == 4
    assert tokens["max_valid_targets_per_step"] == 32 * (seq - 1)
    assert tokens["tokens_per_micro_batch"] == budget
    assert "micro-batches per rank per step" in tokens["varies"]
    rng = random.Random(1)
    counts = set()
    for _ in range(300):
        batches = _budgeted([rng.randint(1, seq) for _ in range(per_rank)], budget)
        assert all(sum(b) <= budget for b in batches)
        counts.add(len(batches))
    assert max(counts) <= tokens["max_micro_batches_per_step"] and len(counts) > 1
    warnings = " ".join(body["warnings"])
    assert "#7104" in warnings and "lr" in warnings and "no_sync" in warnings


def test_a_budget_as_large_as_the_longest_sample_runs_one_micro_batch_a_sample(client: TestClient) -> None:
    body = _plan(client, packing={"mode": "token_budget", "max_tokens_per_micro_batch": 512})
    assert body["tokens"]["max_micro_batches_per_step"] == 8


def test_without_packing_tokens_say_nothing_of_it(client: TestClient) -> None:
    tokens = _plan(client)["tokens"]
    assert tokens["packing"] is None and tokens["varies"] == []
    assert tokens["max_valid_targets_per_step"] is None and tokens["max_micro_batches_per_step"] is None


BAD = [
    # (changes, pointer, the suggestion key whose values must plan)
    (
        {"packing": {"mode": "token_budget"}},
        "/packing/max_tokens_per_micro_batch",
        "max_tokens_per_micro_batch",
    ),
    (
        {"packing": {"mode": "token_budget", "max_tokens_per_micro_batch": 100}},
        "/packing/max_tokens_per_micro_batch",
        "max_tokens_per_micro_batch",
    ),
    (
        {"packing": {"mode": "rows", "max_tokens_per_micro_batch": 100}},
        "/packing/max_tokens_per_micro_batch",
        None,
    ),
    (
        {
            "packing": {
                "mode": "token_budget",
                "max_tokens_per_micro_batch": 4096,
                "document_length": {"max": 600},
            }
        },
        "/packing/document_length/max",
        "document_length.max",
    ),
    (
        {"packing": {"mode": "rows", "document_length": {"mean": 300, "max": 200}}},
        "/packing/document_length/mean",
        "document_length.mean",
    ),
    ({"packing": {"mode": "rows", "document_length": {"mean": 0.5}}}, "/packing/document_length/mean", None),
    ({"packing": {"mode": "rows", "document_length": {"max": 0}}}, "/packing/document_length/max", None),
    ({"packing": {"mode": "packed"}}, "/packing/mode", None),
    ({"packing": {"mode": "rows"}, "loss_normalization": "sample"}, "/loss_normalization", None),
    ({"packing": {"mode": "rows"}, "sequence_length": None}, "/sequence_length", None),
]


@pytest.mark.parametrize(("changes", "pointer", "key"), BAD)
def test_bad_packing_is_a_problem_naming_the_field(
    client: TestClient, changes: dict[str, Any], pointer: str, key: str | None
) -> None:
    body = {k: v for k, v in {**BASE, **changes}.items() if v is not None}
    problem = assert_field_error(client.post("/v1/plans", json=body), pointer)
    if key is None:
        return
    suggested = problem["suggestions"][f"packing.{key}"]
    for value in suggested:  # each suggestion plans
        packing = dict(body["packing"])
        if key.startswith("document_length."):
            packing["document_length"] = {**packing["document_length"], key.split(".")[1]: value}
        else:
            packing[key] = value
        fixed = client.post("/v1/plans", json={**body, "packing": packing})
        assert fixed.status_code == 200, fixed.text


PACKED = {**BASE, "packing": {"mode": "rows"}}


def test_an_export_of_a_packed_plan_is_refused_at_packing(client: TestClient) -> None:
    # deepspeed does not write packed rows yet: a padded loop would train another plan.
    assert_field_error(client.post("/v1/plans/export/deepspeed", json=PACKED), "/packing")


@pytest.mark.parametrize(
    ("fmt", "written"),
    [
        (
            "megatron",
            "--calculate-per-token-loss\n  --reset-position-ids\n  --reset-attention-mask\n  --eod-mask-loss",
        ),
        ("torchtitan", "torchtitan#2318"),  # the plan is pure DDP: its replicate averages
    ],
)
def test_megatron_and_torchtitan_write_packed_rows_and_refuse_a_budget(
    client: TestClient, fmt: str, written: str
) -> None:
    response = client.post(f"/v1/plans/export/{fmt}", json=PACKED)
    assert response.status_code == 200, response.text
    assert written in response.text
    budget = {**PACKED, "packing": {"mode": "token_budget", "max_tokens_per_micro_batch": 1024}}
    problem = assert_field_error(client.post(f"/v1/plans/export/{fmt}", json=budget), "/packing/mode")
    assert "no token-budget batching" in str(problem)


def test_the_hf_trainer_export_writes_packed_rows_and_refuses_a_budget(client: TestClient) -> None:
    response = client.post("/v1/plans/export/hf-trainer", json=PACKED)
    assert response.status_code == 200, response.text
    assert "DataCollatorWithFlattening(" in response.text and "use_cache=False," in response.text
    budget = {**PACKED, "packing": {"mode": "token_budget", "max_tokens_per_micro_batch": 1024}}
    problem = assert_field_error(client.post("/v1/plans/export/hf-trainer", json=budget), "/packing/mode")
    assert "no token-budget batching" in str(problem)


def test_the_python_export_of_a_packed_plan_writes_the_packed_loop(client: TestClient) -> None:
    response = client.post("/v1/plans/export/python", json=PACKED)
    assert response.status_code == 200, response.text
    assert 'PACKING = "rows"' in response.text and "model.no_sync()" in response.text


def test_packed_rows_without_transformers_are_a_problem_at_the_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Refused before any rank runs, naming the extra and the mode that needs none.
    monkeypatch.setattr("app.contract.packed.find_spec", lambda name: None)
    for checks in runner_client(tmp_path, FakeRunner()):
        problem = assert_field_error(checks.post("/v1/checks", json={"plan": PACKED}), "/plan/packing/mode")
        assert "batchplan[consumers]" in str(problem) and "token_budget" in str(problem)


@pytest.mark.parametrize(("extra", "pointer"), [({"steps": 2}, "/steps"), ({"model": "tiny_lm"}, "/model")])
def test_a_packed_check_refuses_what_it_does_not_run(
    tmp_path: Path, extra: dict[str, Any], pointer: str
) -> None:
    for checks in runner_client(tmp_path, FakeRunner()):
        assert_field_error(checks.post("/v1/checks", json={"plan": PACKED, **extra}), pointer)
