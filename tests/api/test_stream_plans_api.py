"""A stream's plan over HTTP (POST /v1/plans with dataset kind "stream"): the answer's `stream`
in place of the sampler, its steps feeding the recipe, the refusals at their fields, a mixed
cluster and a mesh planned by their data-parallel ranks, and what does not take a stream refused
at the dataset's kind."""

from __future__ import annotations

import copy
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.core.records.stream import StreamSpec
from app.core.request.parse import plan_request, request_json
from app.core.split.stream.plan import plan_stream
from app.schemas.examples import STREAM_PLAN_EXAMPLES

STREAM_KEYS = ("num_shards", "splitter", "num_workers")
STREAM: dict[str, Any] = {"kind": "stream", "num_samples": 4096, "num_shards": 16, "splitter": "hf_datasets"}
BODY: dict[str, Any] = {
    "topology": {"num_nodes": 1, "gpus_per_node": 4},
    "global_batch_size": 32,
    "micro_batch_size": 4,
    "dataset": {**STREAM, "num_workers": 2},
}


def _with(**dataset: Any) -> dict[str, Any]:
    body = copy.deepcopy(BODY)
    body["dataset"].update(dataset)
    return {**body, "dataset": {k: v for k, v in body["dataset"].items() if v is not None}}


def _refused(client: TestClient, body: dict[str, Any], pointer: str) -> dict[str, Any]:
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 422, response.text
    problem: dict[str, Any] = response.json()
    assert pointer in {e["pointer"] for e in problem["errors"]}, problem
    return problem


def test_a_stream_plan_answers_its_split_in_place_of_the_sampler(client: TestClient) -> None:
    body = _with(epochs=2)
    body["learning_rate"] = {"base_lr": 0.1, "warmup_epochs": 1}
    answer = client.post("/v1/plans", json=body).json()
    assert answer["sampler"] is None
    stream = answer["stream"]
    assert (stream["splitter"], stream["branch"], stream["readers"]) == ("hf_datasets", "shards", 8)
    assert stream["rank_groups"] == [
        {
            "start": 0,
            "stop": 4,
            "shards": 4,
            "samples": 1024,
            "micro_batches": 256,
            "idle_workers": 0,
            "micro_batch_size": 4,
            "worker_shards": [2, 2],
            "worker_samples": [512, 512],
            "short_micro_batches": [],
        }
    ]
    assert stream["optimizer_steps_per_epoch"] == 128
    assert (stream["samples_trained"], stream["duplicated_samples"], stream["dropped_samples"]) == (
        4096,
        0,
        0,
    )
    # The recipe's epochs count the stream's steps: warmup one epoch, the run two.
    assert answer["learning_rate"]["warmup_steps"] == 128
    assert answer["learning_rate"]["train_steps"] == 256
    assert any("no sampler" in line for line in answer["explanation"])
    assert not any("DistributedSampler(dataset" in line for line in answer["explanation"])


def test_the_swagger_example_plans_with_its_warning_and_advice(client: TestClient) -> None:
    answer = client.post("/v1/plans", json=STREAM_PLAN_EXAMPLES["stream"]["value"]).json()
    stream = answer["stream"]
    assert stream["branch"] == "examples"  # 1000 shards over 16 ranks
    assert stream["samples_read"] == 16 * stream["num_samples"]
    assert [w["code"] for w in stream["warnings"]] == ["examples_branch"]
    assert stream["warnings"][0]["sources"] == ["huggingface/datasets#5961"]
    assert stream["warnings"][0]["message"] in answer["warnings"]
    assert stream["suggested_num_shards"] and all(n % 64 == 0 for n in stream["suggested_num_shards"])


def test_unequal_ranks_are_warned_and_counted_by_the_policy(client: TestClient) -> None:
    # rank_worker over 4 ranks: 75, 50, 25 and 25 micro-batches of 4, steps of 2 (the odd one skipped)
    shards = [300, 200, 100, 100]
    answers = {
        policy: client.post(
            "/v1/plans",
            json=_with(
                num_samples=None,
                num_shards=None,
                shard_samples=shards,
                splitter="rank_worker",
                num_workers=0,
                end_of_epoch=policy,
            ),
        ).json()["stream"]
        for policy in ("drop", "pad", "cycle")
    }
    drop, pad = answers["drop"], answers["pad"]
    assert (drop["micro_batches_per_epoch"], drop["leftover_micro_batches"]) == (25, 1)
    assert (drop["dropped_samples"], drop["duplicated_samples"]) == (700 - 4 * 24 * 4, 0)
    assert (pad["dropped_samples"], pad["duplicated_samples"]) == (4, (74 - 50) * 4 + 2 * (74 - 25) * 4)
    assert answers["cycle"]["micro_batches_per_epoch"] == 75
    for stream in answers.values():
        warning = next(w for w in stream["warnings"] if w["code"] == "unequal_counts")
        assert "pytorch/torchtitan#1618" in warning["sources"]


def test_steps_without_a_step_count_is_warned(client: TestClient) -> None:
    stream = client.post("/v1/plans", json=_with(end_of_epoch="steps")).json()["stream"]
    assert [w["code"] for w in stream["warnings"]] == ["steps_without_count"]
    body = _with(end_of_epoch="steps")
    body["learning_rate"] = {"base_lr": 0.1, "train_steps": 500}
    stream = client.post("/v1/plans", json=body).json()["stream"]
    assert (stream["warnings"], stream["train_steps"]) == ([], 500)


def test_a_stream_without_a_splitter_is_refused_at_the_splitter(client: TestClient) -> None:
    problem = _refused(client, _with(splitter=None), "/dataset/splitter")
    assert "every rank" in problem["detail"] and "whole stream" in problem["detail"]


def test_a_rank_without_a_shard_is_refused_with_the_least_shard_count(client: TestClient) -> None:
    problem = _refused(client, _with(num_shards=3, splitter="webdataset"), "/dataset/num_shards")
    assert problem["suggestions"] == {"dataset.num_shards": [4]}  # split_by_node: one shard a rank
    problem = _refused(client, _with(num_shards=6, splitter="rank_worker"), "/dataset/num_shards")
    assert problem["suggestions"] == {"dataset.num_shards": [7]}  # the last rank's first reader: 3 x 2 + 1


@pytest.mark.parametrize(
    ("dataset", "says"),
    [
        ({"kind": "map", "splitter": "webdataset"}, 'give kind "stream"'),
        ({"kind": "map", "num_samples": None, **dict.fromkeys(STREAM_KEYS)}, "needs num_samples"),
        ({"shard_samples": [256] * 16}, "one of num_samples"),
        ({"num_shards": None}, "needs num_shards"),
        ({"drop_last": True}, "end_of_epoch"),
    ],
)
def test_a_dataset_of_the_wrong_form_is_refused_at_the_dataset(
    client: TestClient, dataset: dict[str, Any], says: str
) -> None:
    problem = _refused(client, _with(**dataset), "/dataset")
    assert says in problem["detail"]


def test_a_stream_under_a_token_budget_is_refused_at_the_packing(client: TestClient) -> None:
    body = {**_with(), "sequence_length": 128, "loss_normalization": "token"}
    body["packing"] = {"mode": "token_budget", "max_tokens_per_micro_batch": 512}
    problem = _refused(client, body, "/packing/mode")
    assert "token budget" in problem["detail"]


def test_a_stream_request_reads_back_as_itself() -> None:
    for dataset in ({"shard_samples": [3, 5, 2], "num_samples": None, "num_shards": None}, {"shuffle": True}):
        request = plan_request(_with(**dataset))
        assert plan_request(request_json(request)) == request
    assert (
        "num_samples"
        not in request_json(plan_request(_with(shard_samples=[3, 5], num_samples=None)))["dataset"]
    )


def test_a_mixed_cluster_splits_by_its_replicas_micro_batches(client: TestClient) -> None:
    """Each replica group's micro-batch counts its ranks' micro-batches: the answer is the core's
    plan for those per-rank sizes, which tests/core/test_stream_split.py holds to what the real
    `datasets` delivers at unequal micro-batches."""
    shards = (7, 3, 5, 9, 4, 6)
    body = _with(num_samples=None, num_shards=None, shard_samples=list(shards), num_workers=2)
    body["topology"] = {
        "node_groups": [
            {"name": "fast", "num_nodes": 1, "gpus_per_node": 1, "relative_throughput": 2.0},
            {"name": "slow", "num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 1.0},
        ]
    }
    body.pop("micro_batch_size")
    body["global_batch_size"] = 8
    answer = client.post("/v1/plans", json=body).json()
    micro = [g["micro_batch_size"] for g in answer["replica_groups"] for _ in range(g["start"], g["stop"])]
    assert len(set(micro)) == 2, answer["replica_groups"]
    spec = StreamSpec(len(shards), "hf_datasets", shard_samples=shards, num_workers=2)
    core = plan_stream(spec, 3, micro, answer["gradient_accumulation_steps"])
    assert answer["stream"]["rank_groups"] == [
        {
            **asdict(g),
            "worker_shards": list(g.worker_shards),
            "worker_samples": list(g.worker_samples),
            "short_micro_batches": [asdict(s) for s in g.short_micro_batches],
        }
        for g in core.rank_groups
    ]


def test_a_mesh_reads_by_its_data_parallel_ranks(client: TestClient) -> None:
    body = _with()
    body["topology"] = {"num_nodes": 1, "gpus_per_node": 8}
    body["parallelism"] = {"tensor": 2}
    answer = client.post("/v1/plans", json=body).json()
    assert answer["stream"]["readers"] == 4 * 2  # 4 data-parallel ranks x 2 workers: tp peers read alike
    assert any("Tensor-, pipeline- and context-parallel peers" in line for line in answer["explanation"])


def test_what_does_not_take_a_stream_yet_refuses_it_at_the_dataset(client: TestClient) -> None:
    body = _with()
    response = client.post("/v1/plans/export/torchrun", json=body)
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/dataset/kind"


@pytest.mark.parametrize(
    ("splitter", "says"),
    [
        ("hf_datasets", "but not across ranks"),
        ("webdataset", "same num_workers"),
    ],
)
def test_a_stream_plans_resume_is_refused_with_the_tools_words(
    client: TestClient, splitter: str, says: str
) -> None:
    body = {
        **_with(splitter=splitter, num_shards=64),
        "resume": {"consumed_samples": 64, "data_parallel_size": 2},
    }
    problem = _refused(client, body, "/resume")
    assert says in problem["detail"]
    assert splitter != "hf_datasets" or "huggingface/datasets#7447" in problem["detail"]


def test_a_rank_worker_resume_says_where_each_reader_starts_and_refuses_at_its_field(
    client: TestClient,
) -> None:
    body = {
        **_with(splitter="rank_worker", num_samples=200, num_shards=8),
        "topology": {"num_nodes": 1, "gpus_per_node": 2},
        "global_batch_size": 16,
        "resume": {"consumed_samples": 48, "data_parallel_size": 1},
    }
    resume = client.post("/v1/plans", json=body).json()["resume"]
    assert (
        resume["optimizer_step"],
        resume["gradient_accumulation_steps"],
        resume["same_global_batches"],
    ) == (3, 4, True)
    assert resume["stream"] == {
        "readers": 4,
        "num_workers": 4,
        "reader_groups": [
            {
                "start": 0,
                "stop": 4,
                "shard_in_reader": 0,
                "offset": 12,
                "skip_samples": 12,
                "skip_micro_batches": 3,
            }
        ],
    }
    body["resume"] = {"consumed_samples": 50, "data_parallel_size": 1}
    assert _refused(client, body, "/resume/consumed_samples")["suggestions"] == {
        "resume.consumed_samples": [48, 64]
    }
    body["resume"] = {"consumed_samples": 48, "data_parallel_size": 3}
    assert _refused(client, body, "/resume/data_parallel_size")["suggestions"] == {
        "resume.data_parallel_size": [2, 4]
    }
    body["resume"] = {"consumed_samples": 48}
    body["dataset"]["end_of_epoch"] = "pad"
    assert '"drop"' in _refused(client, body, "/dataset/end_of_epoch")["detail"]


def test_a_check_of_a_stream_plan_is_accepted_and_its_limits_refused_at_the_dataset(tmp_path: Path) -> None:
    from support.fake_runner import FakeRunner

    from app.main import create_app
    from app.settings import Settings

    settings = Settings(jobs_db=tmp_path / "jobs.sqlite3", log_level="warning")
    with TestClient(create_app(settings, runner=FakeRunner(size=4)), raise_server_exceptions=False) as client:
        accepted = client.post("/v1/checks", json={"plan": _with()})
        too_many = client.post("/v1/checks", json={"plan": _with(num_workers=8)})
        wider = {**_with(), "topology": {"num_nodes": 1, "gpus_per_node": 8}}
        more_ranks = client.post("/v1/checks", json={"plan": wider})
    assert accepted.status_code == 202, accepted.text
    assert too_many.status_code == 422, too_many.text
    assert too_many.json()["errors"][0]["pointer"] == "/plan/dataset/num_workers"
    # one process per rank: 8 ranks on a worker of 4 processes is refused at submission, not run
    assert more_ranks.status_code == 422, more_ranks.text
    problem = more_ranks.json()
    assert problem["errors"][0]["pointer"] == "/plan/topology/gpus_per_node"
    assert problem["suggestions"] == {"topology.gpus_per_node": [4]}
