"""A stream plan's stated loss scales against torch: on a real DataLoader stream (worker
processes, a worker's short last micro-batch), each rank's gradient accumulated with the plan's
scale for each micro-batch (`loss_scale_formula`, the step's samples counted from
`rank_groups[].short_micro_batches`), averaged over the ranks as DDP averages, is the gradient of
the mean loss over the step's samples, the short step's included."""

from __future__ import annotations

import random
from collections.abc import Iterator
from itertools import accumulate

import torch
import torch.utils.data as tud

from app.core.planner import plan
from app.core.split.stream.ids import delivered
from app.core.split.stream.policy import short_positions
from app.schemas.plan_requests import PlanRequestIn

SIZES = (13, 9, 12, 10, 11, 9, 12, 10)  # reader 1 holds 18 samples: a short micro-batch of 2
RANKS, WORKERS, MICRO = 2, 2, 4


class _Readers(tud.IterableDataset[int]):
    """Rank `rank`'s share of a rank_worker stream: worker w reads shards g, g + readers, ..."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __iter__(self) -> Iterator[int]:
        info = tud.get_worker_info()
        g = self.rank * WORKERS + (info.id if info is not None else 0)
        bounds = [0, *accumulate(SIZES)]
        for shard in range(g, len(SIZES), RANKS * WORKERS):
            yield from range(bounds[shard], bounds[shard + 1])


def test_the_plans_loss_scales_make_each_step_with_short_micro_batches_the_mean() -> None:
    body = {
        "topology": {"num_nodes": 1, "gpus_per_node": RANKS},
        "global_batch_size": 16,
        "micro_batch_size": MICRO,
        "dataset": {
            "kind": "stream",
            "shard_samples": list(SIZES),
            "num_shards": len(SIZES),
            "splitter": "rank_worker",
            "num_workers": WORKERS,
        },
    }
    answer = plan(PlanRequestIn.model_validate(body).to_core())
    stream, g = answer.stream, answer.gradient_accumulation_steps
    assert stream is not None and stream.loss_scale_formula is not None
    assert "the step's samples over all ranks" in stream.loss_scale_formula
    shorts = [(s, group) for group in stream.rank_groups for s in group.short_micro_batches]
    assert shorts, "the case needs a short micro-batch trained"
    total = [answer.global_batch_size] * stream.optimizer_steps_per_epoch
    for s, group in shorts:
        total[s.step] -= (group.micro_batch_size - s.samples) * group.count

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(sum(SIZES), 3, generator=generator, dtype=torch.float64)
    y = torch.randn(sum(SIZES), generator=generator, dtype=torch.float64)
    w = torch.randn(3, generator=generator, dtype=torch.float64)

    def grad(ids: list[int], scale: float) -> torch.Tensor:
        weights = w.clone().requires_grad_()
        loss = ((x[ids] @ weights - y[ids]) ** 2).mean() * scale
        (out,) = torch.autograd.grad(loss, weights)
        return out

    runs = [
        [b.tolist() for b in tud.DataLoader(_Readers(r), batch_size=MICRO, num_workers=WORKERS)]
        for r in range(RANKS)
    ]
    short_at = {(r, s.micro_batch): s.samples for s, grp in shorts for r in range(grp.start, grp.stop)}
    for t, step_total in enumerate(total):
        micro = [run[t * g : (t + 1) * g] for run in runs]
        for r, batches in enumerate(micro):  # the plan says which micro-batches are short, and how short
            for k, batch in enumerate(batches):
                assert len(batch) == short_at.get((r, t * g + k), MICRO)
        ranks = [
            torch.stack([grad(b, RANKS * len(b) / step_total) for b in batches]).sum(0) for batches in micro
        ]
        ddp = torch.stack(ranks).mean(0)  # DDP's all-reduce averages the ranks' accumulated gradients
        every = [i for batches in micro for b in batches for i in b]
        assert len(every) == step_total
        mean = grad(every, 1.0)  # (torch.allclose: torch.testing would import torch.distributed.tensor)
        assert torch.allclose(ddp, mean, rtol=1e-12, atol=1e-12), (t, ddp, mean)


def test_the_short_micro_batches_fall_where_the_dataloaders_delivery_puts_them() -> None:
    """Against the delivery order the stream check reads its ranks by (ids.delivered, round by
    round over the workers, held to torch in tests/core/test_stream_split.py), seeded cases."""
    rng = random.Random(0)
    for _ in range(500):
        b = rng.randint(1, 5)
        sizes = tuple(rng.randint(0, 20) for _ in range(rng.randint(1, 6)))
        streams = [list(range(sum(sizes[:w]), sum(sizes[: w + 1]))) for w in range(len(sizes))]
        owner = {i: w for w, stream in enumerate(streams) for i in stream}
        seen = [(p, owner[m[0]], len(m)) for p, m in enumerate(delivered(streams, b)) if len(m) < b]
        assert short_positions(sizes, b) == seen, (sizes, b)
