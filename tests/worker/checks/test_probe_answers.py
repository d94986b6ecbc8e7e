"""The equivalence probes' seeding, and their answers kept on warm ranks: used only when every
rank holds its own, equal to what probing again finds, dropped when the key changes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from app.contract.codec import encode
from app.contract.request import build_spec, check_request
from app.worker.checks import probe_answers
from app.worker.checks.driver import run_spec
from app.worker.checks.equivalence_probes import PROBE_SEED, seed_devices
from app.worker.checks.result_parts import CheckGroup
from app.worker.checks.shards import Shards
from app.worker.training.workload import Registered
from tests.support.gloo_ranks import on_ranks

CPU = torch.device("cpu")
RANK_DEPENDENT = "app.worker.example_models:rank_dependent_mlp"


def test_seeding_the_devices_draws_what_torch_manual_seed_draws() -> None:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(PROBE_SEED)
        expected = torch.rand(64, dtype=torch.float64), torch.randn(8)
        seed_devices(PROBE_SEED, CPU)
        drawn = torch.rand(64, dtype=torch.float64), torch.randn(8)
    assert all(torch.equal(a, b) for a, b in zip(drawn, expected, strict=True))


def _deterministic(result: Any) -> dict[str, Any]:
    return {k: v for k, v in encode(result).items() if k not in {"timings_s", "setup_s"}}


def _kept_answers_are_agreed(rank: int, world: int) -> dict[str, Any]:
    workload = Registered("rank_dependent_mlp", RANK_DEPENDENT)
    request = {"plan": {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 8}}
    spec = dataclasses.replace(build_spec(check_request(request)), model=workload.name)
    group = CheckGroup(rank, world, CPU, "gloo")
    probe = Shards(spec).derived(0)[0]
    key = probe_answers.key_of(torch.float64, CPU, probe, rank, world)

    first = run_spec(spec, group, workload, None)  # probes, and keeps the answers
    held_after_first = probe_answers.kept(workload, key, CPU) is not None
    second = run_spec(spec, group, workload, None)  # every rank holds them: used
    other_dtype = probe_answers.key_of(torch.float32, CPU, probe, rank, world)
    held_for_other_dtype = probe_answers.kept(workload, other_dtype, CPU) is not None
    if rank == 1:
        probe_answers._KEPT.clear()  # as a replaced rank process starts
    held_after_one_lost = probe_answers.kept(workload, key, CPU) is not None
    third = run_spec(spec, group, workload, None)  # every rank probes again, none waits
    return {
        "held": [held_after_first, held_for_other_dtype, held_after_one_lost],
        "results": [_deterministic(r) for r in (first, second, third)] if rank == 0 else None,
    }


@pytest.mark.slow
def test_kept_answers_are_used_only_when_every_rank_holds_them_and_equal_fresh_ones() -> None:
    ranks = on_ranks(2, _kept_answers_are_agreed)
    assert [r["held"] for r in ranks] == [[True, False, False], [True, False, False]]
    first, second, third = ranks[0]["results"]
    causes = [f["cause"] for f in first["ddp_equivalence"]["findings"]]
    assert "rank_dependent" in causes  # the rank probe's answer, a collective's, was kept
    assert second == first and third == first
