"""The `tokens` check of a packed or budgeted plan on the session's 4 warm gloo ranks: seeded
documents packed into rows by transformers' DataCollatorWithFlattening, or filled into unequal
numbers of micro-batches per rank under a token budget, every step's gradient against the
single-process mean over every valid target, and each normalisation mistake detected."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

pytest.importorskip("torch")

from fastapi.testclient import TestClient
from support.polling import check_result

from app.contract.packed import PACKED_STEPS
from app.contract.request import build_spec, check_request
from app.worker.training.packed_model import step_micro_batches, targets

CONTROLS = ["per_micro_batch_mean", "per_rank_mean", "world_size_not_undone", "boundary_target_counted"]
BASE: dict[str, Any] = {
    "topology": {"num_nodes": 1, "gpus_per_node": 4},
    "global_batch_size": 16,
    "micro_batch_size": 2,
    "sequence_length": 16,
    "loss_normalization": "token",
}
ROWS = {**BASE, "packing": {"mode": "rows", "document_length": {"max": 6}}}
BUDGET = {
    **BASE,
    "packing": {"mode": "token_budget", "max_tokens_per_micro_batch": 16, "document_length": {"max": 12}},
}


SYNC, LR = "sync_every_micro_batch", "lr_rescaled_per_batch"


def _passes_with_every_control(result: dict[str, Any], unequal_micro_batches: bool) -> None:
    """Every control detected; the hang only where ranks run unequal micro-batch counts (it is
    skipped otherwise), and the run-level lr rescaling after the step's controls."""
    assert result["workload"] == "tokens" and result["processes"] == 4
    assert result["rel_l2"] <= result["tolerance"], result
    hangs = [SYNC] if unequal_micro_batches else []
    assert [c["name"] for c in result["controls"]] == CONTROLS + hangs + [LR]
    assert all(c["detected"] for c in result["controls"]), result["controls"]
    assert [c["name"] for c in result["controls"] if c["hung"]] == hangs
    skipped = [c["name"] for c in result["controls_skipped"]]
    assert skipped == ([] if unequal_micro_batches else [SYNC]) and result["passed"]


def test_packed_rows_pass_and_every_control_is_detected(default_worker: TestClient) -> None:
    pytest.importorskip("transformers")
    _passes_with_every_control(check_result(default_worker, {"plan": ROWS}), unequal_micro_batches=False)


def test_a_token_budget_with_unequal_micro_batches_per_rank_passes(default_worker: TestClient) -> None:
    spec = build_spec(check_request({"plan": BUDGET}))
    for step in range(PACKED_STEPS):  # the ranks run different micro-batch counts in the same step
        batches = [step_micro_batches(spec, step, r) for r in range(4)]
        assert len({len(b) for b in batches}) > 1
        assert len({sum(targets(m) for m in b) for b in batches}) > 1
    # An all-reduce per micro-batch hangs on the unequal counts: detected by its timeout, with no
    # gradient to compare.
    result = check_result(default_worker, {"plan": BUDGET})
    _passes_with_every_control(result, unequal_micro_batches=True)
    hung = result["controls"][-2]
    assert hung["rel_l2"] is None and hung["max_abs_diff"] is None
    # The warm ranks, whose throwaway group timed out, serve the next check as before.
    assert check_result(default_worker, {"plan": ROWS if _has_transformers() else BUDGET})["passed"]


def _has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def test_the_spec_carries_the_plans_packing() -> None:
    spec = build_spec(check_request({"plan": BUDGET}))
    assert dataclasses.asdict(spec)["packing"]["max_tokens_per_micro_batch"] == 16


def test_no_document_sees_another_in_its_row() -> None:
    import torch

    from app.worker.training.packed_model import PackedLanguageModel, flatten
    from app.worker.training.token_model import TinyLanguageModel

    torch.manual_seed(0)
    model = PackedLanguageModel().double()
    docs = [[3, 4, 5], [6, 7], [8, 9, 10, 11]]
    row = flatten(docs)
    packed = model(row["input_ids"], row["position_ids"])
    alone = torch.cat([model(torch.tensor([d])) for d in docs], dim=1)
    assert torch.allclose(packed, alone, rtol=0, atol=1e-12)  # up to the running sum's rounding
    # The running mean over the whole row (the tokens check's model) lets documents leak.
    assert not torch.allclose(TinyLanguageModel.forward(model, row["input_ids"]), alone)


def test_the_lr_rescaling_is_skipped_only_where_every_micro_batch_holds_the_same_targets() -> None:
    from app.worker.checks.packed_lr import harmless_because

    spec = dataclasses.replace(
        build_spec(check_request({"plan": BUDGET})), global_batch_size=4, gradient_accumulation_steps=1
    )
    # (targets, tokens) per micro-batch: 64 tokens a step, the plan's 4 x 16.
    assert "lr multiplier is 1" in (harmless_because(spec, [{0: [(30, 32)], 1: [(30, 32)]}]) or "")
    assert harmless_because(spec, [{0: [(30, 32)], 1: [(29, 32)]}]) is None  # unequal targets
    assert harmless_because(spec, [{0: [(30, 33)], 1: [(30, 32)]}]) is None  # 65 tokens: lr x 65/64


def test_a_control_that_changes_no_gradient_is_skipped_with_its_reason() -> None:
    from app.worker.checks.packed_check import PACKED_CONTROLS
    from app.worker.checks.token_check import changes_gradient

    by_name = {c.name: c for c in PACKED_CONTROLS}
    one_replica = {0: [(5, 7), (9, 11)]}  # (targets, targets + documents) per micro-batch
    assert not changes_gradient(by_name["world_size_not_undone"].scale, one_replica)
    assert "data_parallel_size is 1" in by_name["world_size_not_undone"].harmless_when
    equal = {0: [(6, 8)], 1: [(6, 9)]}
    assert not changes_gradient(by_name["per_rank_mean"].scale, equal)
    assert not changes_gradient(by_name["per_micro_batch_mean"].scale, equal)
    assert changes_gradient(by_name["boundary_target_counted"].scale, equal)
    assert changes_gradient(by_name["world_size_not_undone"].scale, equal)
