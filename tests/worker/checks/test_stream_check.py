"""The stream check on the session's warm gloo ranks (tests/conftest.py): each splitter's real
library, read through real DataLoader worker processes, trains every sample as the plan
predicts, every step's gradient within tolerance of the single-process mean, and each control
that changes the run is detected; a hung control (unequal counts, no policy) costs the warm
ranks nothing: the next check on them passes. One small check per splitter."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from fastapi.testclient import TestClient
from support.polling import run_check

pytestmark = pytest.mark.slow

CONTROLS = [
    "no_rank_split",
    "no_worker_split",
    "same_reader_index",
    "unseeded_shuffle",
    "no_end_of_epoch_policy",
]
# Uneven shards: the ranks' counts differ, so without a policy the first to run dry hangs the rest.
UNEVEN = [20, 12, 8, 30, 16, 10, 24, 6, 14, 18, 22, 4, 28, 2, 26, 16]


@pytest.fixture
def client(default_worker: TestClient) -> TestClient:
    return default_worker


def stream_plan(ranks: int = 4, **dataset: Any) -> dict[str, Any]:
    return {
        "topology": {"num_nodes": 1, "gpus_per_node": ranks},
        "global_batch_size": 8 * ranks,
        "micro_batch_size": 8,
        "dataset": {"kind": "stream", "num_workers": 2, **dataset},
    }


def checked(client: TestClient, plan: dict[str, Any]) -> dict[str, Any]:
    job = run_check(client, {"plan": plan, "dtype": "float64"}, timeout=120)
    assert job["status"] == "succeeded", job
    result: dict[str, Any] = job["result"]
    assert result["passed"] and result["stream"]["matches_plan"], result
    planned = client.post("/v1/plans", json=plan).json()["stream"]
    stream = result["stream"]
    assert stream["optimizer_steps"] == planned["optimizer_steps_per_epoch"]
    assert stream["seen_more"] == stream["predicted"]["seen_more"]
    assert stream["missing"] == stream["predicted"]["missing"] == planned["dropped_samples"]
    return result


def controls(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in result["controls"] + result["controls_skipped"]}


def test_a_hung_control_is_detected_and_the_next_check_on_the_warm_ranks_passes(client: TestClient) -> None:
    plan = stream_plan(num_shards=16, shard_samples=UNEVEN, splitter="rank_worker", end_of_epoch="pad")
    hung = checked(client, plan)
    found = controls(hung)
    assert list(found) == CONTROLS
    assert found["no_end_of_epoch_policy"]["hung"] and found["no_end_of_epoch_policy"]["rel_l2"] is None
    assert all(c["detected"] for c in hung["controls"]) and len(hung["controls"]) == 5
    # pad repeats what the short ranks lack: duplicates, nothing missing
    assert hung["stream"]["seen_more"] > 0 and hung["stream"]["missing"] == 0
    again = checked(client, stream_plan(num_samples=256, num_shards=16, splitter="webdataset"))
    assert "hung" not in str(again["controls_skipped"]) and not any(c["hung"] for c in again["controls"])
    assert again["stream"]["ranks"] == [{"rank": 0, "stop": 4, "samples": 64, "micro_batches": 8}]
    assert [c["name"] for c in again["controls"]] == CONTROLS[:4]


def test_hf_datasets_split_by_node_in_its_examples_branch(client: TestClient) -> None:
    # 3 shards over 2 ranks: split_dataset_by_node keeps every other example on each rank. Two
    # ranks, not four: each imports `datasets` on its first such check (~4 CPU-s).
    plan = stream_plan(2, num_samples=125, num_shards=3, splitter="hf_datasets", shuffle=True, seed=5)
    result = checked(client, plan)
    skipped = {c["name"]: c["reason"] for c in result["controls_skipped"]}
    assert "_iter_pytorch" in skipped["no_worker_split"] and "_iter_pytorch" in skipped["same_reader_index"]
    assert {c["name"] for c in result["controls"]} <= {
        "no_rank_split",
        "unseeded_shuffle",
        "no_end_of_epoch_policy",
    }
    assert all(c["detected"] for c in result["controls"])
