"""POST /v1/plans/elastic with `dataset` and `resume`: each GPU count's resume, held against
torch's own DistributedSampler and DataLoader (tests/core/test_resume_vs_torch.py's reader):
restarted on that count as its resume says, the run's later global batches are the
uninterrupted run's exactly where `same_global_batches` says so, and differ where it says not."""

from __future__ import annotations

import random
from typing import Any

from fastapi.testclient import TestClient
from test_resume_vs_torch import _even_sampler, _loader, run


def _steps_per_epoch(data: dict[str, Any], count: dict[str, int]) -> int:
    """Whole optimizer steps of an epoch on this count, from torch's own loader."""
    sampler = _even_sampler(data, count["gpus"], 0, 0)
    return (
        len(_loader(data["num_samples"], sampler, count["micro_batch_size"]))
        // count["gradient_accumulation_steps"]
    )


def test_each_counts_resume_is_what_torch_reads_there(client: TestClient) -> None:
    rng = random.Random(7)
    checked = {True: 0, False: 0}
    for _ in range(12):
        data = {
            "num_samples": rng.randint(150, 400),
            "shuffle": True,
            "seed": rng.randint(0, 9),
            "drop_last": rng.random() < 0.5,
            "epochs": 2,
        }
        body = {"min_gpus": 1, "max_gpus": 6, "micro_batch_sizes": [2, 3, 4], "max_global_batch_size": 48}
        body["dataset"] = data
        base = rng.choice(client.post("/v1/plans/elastic", json=body).json()["counts"])
        steps = _steps_per_epoch(data, base)
        step = rng.randrange(2 * steps)
        resume = {"optimizer_step": step, "data_parallel_size": base["gpus"]}
        counts = client.post("/v1/plans/elastic", json={**body, "resume": resume}).json()["counts"]
        uninterrupted = run(
            data, [base["micro_batch_size"]] * base["gpus"], base["gradient_accumulation_steps"], 2 * steps
        )
        for count in counts:
            r = count["resume"]
            assert (r["epoch"], r["step_in_epoch"]) == divmod(step, steps)
            assert r["skip_micro_batches"] == r["step_in_epoch"] * count["gradient_accumulation_steps"]
            micro = [count["micro_batch_size"]] * count["gpus"]
            accumulation = count["gradient_accumulation_steps"]
            later = run(data, micro, accumulation, 2 * steps - step, r["epoch"], r["skip_micro_batches"])
            assert (later == uninterrupted[step:]) is r["same_global_batches"], (data, base, count)
            checked[r["same_global_batches"]] += 1
    assert checked[True] and checked[False], checked


def test_a_resume_needs_the_dataset_and_one_of_the_counts(client: TestClient) -> None:
    body = {"min_gpus": 1, "max_gpus": 8, "micro_batch_sizes": [2, 4], "max_global_batch_size": 64}
    response = client.post(
        "/v1/plans/elastic", json={**body, "resume": {"optimizer_step": 3, "data_parallel_size": 4}}
    )
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/resume"
    body["dataset"] = {"num_samples": 1000, "epochs": 2}
    response = client.post(
        "/v1/plans/elastic", json={**body, "resume": {"optimizer_step": 3, "data_parallel_size": 7}}
    )
    problem = response.json()
    assert response.status_code == 422 and problem["errors"][0]["pointer"] == "/resume/data_parallel_size"
    for size in problem["suggestions"]["resume.data_parallel_size"]:
        again = {**body, "resume": {"optimizer_step": 3, "data_parallel_size": size}}
        assert client.post("/v1/plans/elastic", json=again).status_code == 200
