"""The plan's `resume` against torch's own DistributedSampler and DataLoader.

Over seeded random plans (even and accumulated splits, batches in tokens, drop_last and
padding, resumes in every epoch of runs of one to three epochs) the uninterrupted run is read
from W ranks' real loaders, each epoch's leftover micro-batches dropped as the plan drops
them, and grouped into optimizer steps: per step, the multiset of sample indices of every
rank's micro-batches. The resumed run is read from W2 ranks' real loaders exactly as the
answer says: `set_epoch(resume.epoch)`, skip `skip_micro_batches` micro-batches of the epoch,
then go on with the answer's micro-batch and accumulation. Where the answer says
`same_global_batches`, every later step must be the uninterrupted run's; where it says not,
some later step must differ, and each data-parallel size it suggests must resume exactly, in
torch as well. A mixed cluster's plan, resumed on its own replicas, is held the same way
against the workers' ProportionalSampler.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import torch.utils.data as tud

from app.core.planner import plan
from app.core.records.plan import Plan
from app.schemas.plan_requests import PlanRequestIn
from app.worker.training.samplers import ProportionalSampler

CASES = 300
Step = Counter[int]


def _planned(body: dict[str, Any]) -> Plan:
    return plan(PlanRequestIn.model_validate(body).to_core())


def _loader(n: int, sampler: tud.Sampler[int], micro: int) -> list[list[int]]:
    loader = tud.DataLoader(list(range(n)), batch_size=micro, sampler=sampler, drop_last=False)
    return [batch.tolist() for batch in loader]


def _even_sampler(data: dict[str, Any], replicas: int, rank: int, epoch: int) -> tud.Sampler[int]:
    sampler = tud.DistributedSampler(
        range(data["num_samples"]),  # type: ignore[arg-type]
        num_replicas=replicas,
        rank=rank,
        shuffle=data["shuffle"],
        seed=data["seed"],
        drop_last=data["drop_last"],
    )
    sampler.set_epoch(epoch)
    return sampler


def run(
    data: dict[str, Any],
    micro: list[int],
    accumulation: int,
    steps: int,
    epoch: int = 0,
    skip: int = 0,
    proportional: bool = False,
) -> list[Step]:
    """`steps` optimizer steps of the ranks' real loaders (a rank per entry of `micro`), from
    `epoch`, its first `skip` micro-batches skipped on every rank."""
    out: list[Step] = []
    n = data["num_samples"]
    while len(out) < steps:
        loaders = []
        for rank, m in enumerate(micro):
            if proportional:
                sampler: tud.Sampler[int] = ProportionalSampler(
                    n, micro, rank, shuffle=data["shuffle"], seed=data["seed"], drop_last=data["drop_last"]
                )
                sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            else:
                sampler = _even_sampler(data, len(micro), rank, epoch)
            loaders.append(_loader(n, sampler, m)[skip:])
        whole = len(loaders[0]) // accumulation
        # Only the resumed epoch may have nothing left: a resume past its last step on W2 ranks.
        assert whole or skip, "an epoch without a whole step"
        for k in range(whole):
            step: Step = Counter()
            for batches in loaders:
                for batch in batches[k * accumulation : (k + 1) * accumulation]:
                    step.update(batch)
            out.append(step)
            if len(out) == steps:
                break
        epoch, skip = epoch + 1, 0
    return out


def _body(rng: random.Random) -> dict[str, Any]:
    replicas, micro, accumulation = rng.randint(1, 5), rng.randint(1, 4), rng.randint(1, 3)
    batch = micro * accumulation * replicas
    data = {
        "num_samples": rng.randint(batch, 4 * batch + 7),
        "shuffle": rng.random() < 0.8,
        "seed": rng.randint(0, 9),
        "drop_last": rng.random() < 0.4,
        "epochs": rng.randint(1, 3),
    }
    body: dict[str, Any] = {"topology": {"num_nodes": 1, "gpus_per_node": replicas}, "dataset": data}
    if rng.random() < 0.25:  # the batch in tokens, as torchtitan counts it
        seq = rng.choice([4, 16])
        body |= {"sequence_length": seq, "global_batch_tokens": batch * seq}
        body["micro_batch_tokens"] = micro * seq
    else:
        body |= {"global_batch_size": batch, "micro_batch_size": micro}
    return body


def _resumed_steps(body: dict[str, Any], planned: Plan) -> list[Step]:
    r = planned.resume
    assert r is not None and r.micro_batch_size is not None and r.remaining_steps is not None
    micro = [r.micro_batch_size] * r.data_parallel_size
    accumulation, skip = r.gradient_accumulation_steps, r.skip_micro_batches
    return run(body["dataset"], micro, accumulation, r.remaining_steps, r.epoch, skip)


def test_skip_micro_batches_reproduces_the_uninterrupted_global_batches_in_torch() -> None:
    rng = random.Random(37)
    tried = exact = inexact = suggested = 0
    while tried < CASES:
        body = _body(rng)
        original = _planned(body)
        sampler = original.sampler
        if sampler is None or sampler.optimizer_steps_per_epoch == 0 or not sampler.total_optimizer_steps:
            continue
        tried += 1
        dp, m = original.data_parallel_size, original.micro_batch_size
        g = original.gradient_accumulation_steps
        assert m is not None
        total = sampler.total_optimizer_steps
        uninterrupted = run(body["dataset"], [m] * dp, g, total)
        step = rng.randrange(total)
        replicas = rng.choice([d for d in range(1, 2 * dp + 2) if original.global_batch_size % d == 0])
        body = {**body, "resume": {"optimizer_step": step, "data_parallel_size": replicas}}
        planned = _planned(body)
        r = planned.resume
        assert r is not None and r.optimizer_step == step and r.data_parallel_size == replicas
        assert r.remaining_steps == total - step
        resumed = _resumed_steps(body, planned)
        if r.same_global_batches:
            exact += 1
            assert resumed == uninterrupted[step:], (body, r)
        else:
            inexact += 1
            assert resumed != uninterrupted[step:], (body, r)
            assert r.why
            for size in r.suggestions.get("resume.data_parallel_size", []):
                suggested += 1
                again = _planned({**body, "resume": {"optimizer_step": step, "data_parallel_size": size}})
                assert again.resume is not None and again.resume.same_global_batches
                assert _resumed_steps(body, again) == uninterrupted[step:], (body, size)
    # Both verdicts were put to torch, and suggestions too.
    assert exact > CASES // 3 and inexact > 10 and suggested > 10, (exact, inexact, suggested)


def test_a_mixed_cluster_resumes_exactly_on_its_own_replicas() -> None:
    rng = random.Random(5)
    for _ in range(30):
        accumulation = rng.randint(1, 3)
        body = {
            "topology": {
                "node_groups": [
                    {"name": "fast", "num_nodes": 1, "gpus_per_node": 2, "relative_throughput": 2.0},
                    {"name": "slow", "num_nodes": 1, "gpus_per_node": 1, "relative_throughput": 1.0},
                ]
            },
            "global_batch_size": 5 * accumulation * rng.randint(1, 2),
            "gradient_accumulation_steps": accumulation,
            "dataset": {
                "num_samples": rng.randint(40, 90),
                "shuffle": True,
                "seed": rng.randint(0, 9),
                "drop_last": rng.random() < 0.5,
                "epochs": 2,
            },
        }
        original = _planned(body)
        assert original.split == "proportional" and original.sampler is not None
        micro = [grp.micro_batch_size for grp in original.replica_groups for _ in range(grp.start, grp.stop)]
        total = original.sampler.total_optimizer_steps
        assert total
        uninterrupted = run(body["dataset"], micro, accumulation, total, proportional=True)
        step = rng.randrange(total)
        r = _planned({**body, "resume": {"optimizer_step": step}}).resume
        assert r is not None and r.same_global_batches and r.micro_batch_size is None
        skips = {grp.skip_micro_batches for grp in r.replica_groups}
        assert skips == {r.skip_micro_batches}
        assert [grp.skip_samples for grp in r.replica_groups] == [
            r.skip_micro_batches * grp.micro_batch_size for grp in r.replica_groups
        ]
        resumed = run(body["dataset"], micro, accumulation, total - step, r.epoch, r.skip_micro_batches, True)
        assert resumed == uninterrupted[step:]
