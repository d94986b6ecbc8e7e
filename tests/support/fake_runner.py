"""A check runner for API tests: no torch, no processes. Checks pass at once with a small
result, unless a test holds them (`gate`) or makes them fail (`error`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from app.contract.check_result import CheckedSplit, CheckResult, Comparison, Setup
from app.contract.equivalence import Equivalence
from app.contract.host import BuiltModel, ProcessDescription
from app.contract.protocol import HostInfo
from app.worker.service.runner import CheckOrder


@dataclass
class FakeRank:
    busy: bool = False


def passing_result(order: CheckOrder) -> CheckResult:
    """What a passing check returns, typed as the real runner's is."""
    spec = order.spec
    return CheckResult(
        model=spec.model,
        ddp_equivalence=Equivalence(equivalent=True, fails_with_ddp_defaults=False, summary="", findings=()),
        setup=Setup(backend="gloo", device="cpu", device_name="cpu", dtype=spec.dtype, nnodes=1, processes=1),
        layout=CheckedSplit(
            data_parallel_size=spec.data_parallel_size,
            replicas_per_process=spec.data_parallel_size,
            global_batch_size=spec.global_batch_size,
            micro_batch_sizes=tuple(sorted(set(spec.micro_batch_sizes()))),
            gradient_accumulation_steps=spec.gradient_accumulation_steps,
            split=spec.split,
        ),
        gradient=Comparison(max_abs_diff=0.0, rel_l2=0.0, tolerance=1e-12),
        controls=(),
        controls_skipped=(),
        sampler_checked=True,
        noise_scale=None,
        micro_batch_search=None,
        timings={"rank_total": 0.0},
        torch_version="fake",
        node_rank=0,
    )


class FakeRunner:
    """Satisfies app.worker.service.runner.CheckRunner."""

    def __init__(self, size: int = 2, models_info: dict[str, BuiltModel] | None = None) -> None:
        self.size = size
        self.host_info = HostInfo(torch_version="fake", cuda_available=False, gpus=0, backends=["gloo"])
        self.models_info = dict(models_info or {})
        self.spawn_error: str | None = None
        self.failing: str | None = None
        self.orders: list[CheckOrder] = []
        self.gate: asyncio.Event | None = None  # set: a check waits for it
        self.error: Exception | None = None  # set: a check raises it
        self.started = self.stopping = self.stopped = False
        self._ranks: list[FakeRank] = []

    def start(self) -> None:
        self.started = True
        self._ranks = [FakeRank() for _ in range(self.size)]

    def begin_stop(self) -> None:
        self.stopping = True

    async def stop(self) -> None:
        self.stopping = self.stopped = True
        self._ranks = []

    def warm(self) -> list[FakeRank]:
        return list(self._ranks)

    def describe(self) -> list[ProcessDescription]:
        return [ProcessDescription(None, "busy" if r.busy else "idle") for r in self._ranks]

    async def run_check(self, order: CheckOrder) -> CheckResult:
        self.orders.append(order)
        rank = self._ranks[0]
        rank.busy = True
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.error is not None:
                raise self.error
            return passing_result(order)
        finally:
            rank.busy = False
