"""The micro-batch finder: the pure search order, the CPU live-memory tracker against known
allocations, the probe's training step, and the whole search on real models."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from app.core.micro_batch_search import (
    SearchResult,
    Trial,
    affine_bytes_per_sample,
    budget_bytes,
    search_max_micro_batch,
)
from app.worker.measure.memory import is_out_of_memory, probe
from app.worker.measure.memory_meter import LiveTensorTracker, PeakMemory
from app.worker.measure.micro_batch_fit import find_max_micro_batch

MIB = 1024 * 1024
CPU = torch.device("cpu")

# --- the pure search ------------------------------------------------------------------------


def run_search(threshold: int, limit: int, start: int = 1) -> tuple[SearchResult, list[int]]:
    """Search a monotone `fits(b) = b <= threshold`, recording the sizes tried."""
    tried: list[int] = []

    def try_size(size: int) -> Trial:
        tried.append(size)
        return Trial(micro_batch_size=size, fits=size <= threshold, peak_bytes=size * 100)

    return search_max_micro_batch(try_size, limit=limit, start=start), tried


def brute_force(threshold: int, limit: int) -> int:
    return max((b for b in range(1, limit + 1) if b <= threshold), default=0)


@pytest.mark.parametrize("start", [1, 3, 8])
def test_search_matches_a_linear_scan_for_every_threshold_and_limit(start: int) -> None:
    for limit in range(start, 70):
        for threshold in range(limit + 2):
            result, tried = run_search(threshold, limit, start)
            assert result.max_micro_batch_size == brute_force(threshold, limit), (threshold, limit)
            assert len(tried) == len(set(tried)), tried
            assert all(1 <= size <= limit for size in tried)
            assert [t.micro_batch_size for t in result.trials] == tried
            assert result.hit_limit == (threshold >= limit)
            assert len(tried) <= 2 * math.ceil(math.log2(limit + 1)) + 2


def test_search_over_a_large_limit_stays_logarithmic() -> None:
    rng = random.Random(0)
    for threshold in [0, 1, 2, 1000, 65535, 65536, *rng.sample(range(1, 70000), 40)]:
        result, tried = run_search(threshold, 65536)
        assert result.max_micro_batch_size == min(threshold, 65536)
        assert len(tried) == len(set(tried)) <= 34


def test_search_doubles_then_clamps_to_the_limit() -> None:
    result, tried = run_search(threshold=10**9, limit=100)
    assert tried == [1, 2, 4, 8, 16, 32, 64, 100]
    assert result.hit_limit and result.max_micro_batch_size == 100


def test_search_then_bisects_between_the_last_fit_and_the_first_failure() -> None:
    _, tried = run_search(threshold=45, limit=1000)
    assert tried == [1, 2, 4, 8, 16, 32, 64, 48, 40, 44, 46, 45]


def test_nothing_fits_gives_zero_after_one_trial() -> None:
    result, tried = run_search(threshold=0, limit=64)
    assert (result.max_micro_batch_size, result.hit_limit, tried) == (0, False, [1])


def test_a_failing_start_searches_below_it() -> None:
    result, tried = run_search(threshold=5, limit=64, start=16)
    assert result.max_micro_batch_size == 5 and tried[0] == 16 and len(tried) == len(set(tried))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"limit": 0}, "limit must be at least 1"),
        ({"limit": 8, "start": 0}, "start must be at least 1"),
        ({"limit": 8, "start": 9}, "must not exceed limit"),
        ({"limit": 8.0}, "limit must be an integer"),
        ({"limit": True}, "limit must be an integer"),
    ],
)
def test_search_rejects_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    def never(size: int) -> Trial:
        raise AssertionError("no trial should run")

    with pytest.raises(ValueError, match=message):
        search_max_micro_batch(never, **kwargs)


def test_search_rejects_a_trial_for_another_size() -> None:
    with pytest.raises(ValueError, match="returned a trial for micro-batch 2"):
        search_max_micro_batch(lambda size: Trial(size + 1, True, None), limit=4)


def test_trial_validates_its_fields() -> None:
    with pytest.raises(ValueError, match="micro_batch_size"):
        Trial(0, True, None)
    with pytest.raises(ValueError, match="peak_bytes"):
        Trial(1, True, -1)


def test_budget_is_the_capacity_less_the_margin_rounded_down() -> None:
    assert budget_bytes(10, 0.1) == 9
    assert budget_bytes(1000, 0) == 1000
    assert budget_bytes(141_000_000_000, 0.1) == 126_900_000_000
    assert budget_bytes(7, 0.5) == 3
    assert budget_bytes(0, 0.2) == 0


@pytest.mark.parametrize(
    ("capacity", "margin"), [(100, 1.0), (100, -0.01), (100, math.nan), (-1, 0.1), (100.0, 0.1), (100, "0.1")]
)
def test_budget_rejects_bad_arguments(capacity: Any, margin: Any) -> None:
    with pytest.raises(ValueError):
        budget_bytes(capacity, margin)


def test_affine_fit_recovers_the_slope() -> None:
    assert affine_bytes_per_sample([(1, 1100), (2, 1200), (8, 1800)]) == pytest.approx(100)
    assert affine_bytes_per_sample([(4, 10), (4, 12)]) is None
    assert affine_bytes_per_sample([]) is None


# --- the CPU tracker ------------------------------------------------------------------------


def test_tracker_counts_a_known_allocation_exactly_and_its_release() -> None:
    tracker = LiveTensorTracker()
    with tracker:
        before = tracker.live_bytes
        block = torch.empty(2 * MIB, dtype=torch.float32)  # 8 MiB
        assert tracker.live_bytes - before == 8 * MIB
        views = (block.view(-1), block[::2], block.t(), block.add_(1))
        assert tracker.live_bytes - before == 8 * MIB  # views and in-place results are not new memory
        del block, views
        assert tracker.live_bytes == before
        small = torch.ones(1000, dtype=torch.float64)
        assert tracker.live_bytes - before == 8000
    assert tracker.peak_bytes - before == 8 * MIB
    del small
    assert tracker.live_bytes == before


def test_tracker_counts_tensors_built_from_python_data() -> None:
    tracker = LiveTensorTracker()
    with tracker:
        values = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
        assert tracker.live_bytes == 32 and tracker.tracks(values)


def test_tracker_sees_backward_and_the_optimizer_step() -> None:
    model = nn.Linear(256, 128)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    tracker = LiveTensorTracker()
    tracker.track(model.parameters())
    assert tracker.live_bytes == parameter_bytes
    optimizer = torch.optim.Adam(model.parameters())
    with tracker:
        loss = model(torch.randn(4, 256)).square().mean()
        loss.backward()
        optimizer.step()
    grads = [p.grad for p in model.parameters()]
    states = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    assert all(g is not None and tracker.tracks(g) for g in grads)
    assert all(tracker.tracks(s) for s in states)
    # weights, grads and two Adam moments each the size of the weights
    assert tracker.live_bytes >= 4 * parameter_bytes
    optimizer.state.clear()  # Adam sits in a reference cycle; its state would wait for the collector
    del loss, grads, states, optimizer
    model.zero_grad(set_to_none=True)
    assert tracker.live_bytes < 1.01 * parameter_bytes


def test_tracker_stops_a_step_that_passes_its_level() -> None:
    tracker = LiveTensorTracker(stop_above_bytes=4 * MIB)
    with pytest.raises(MemoryError, match="above the budget"), tracker:
        keep = [torch.empty(MIB, dtype=torch.uint8) for _ in range(8)]
        del keep
    assert 4 * MIB < tracker.peak_bytes <= 5 * MIB


def test_peak_memory_on_cpu_counts_resident_tensors() -> None:
    weights = torch.zeros(MIB, dtype=torch.uint8)
    with PeakMemory(CPU, resident=[weights]) as meter:
        scratch = torch.empty(3 * MIB, dtype=torch.uint8)
        del scratch
    assert meter.peak_bytes == 4 * MIB


# --- the probe and the finder on real models ------------------------------------------------


class Pairs(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, size: int = 64, inputs: int = 32, outputs: int = 10) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(size, inputs, generator=generator)
        self.y = torch.randn(size, outputs, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


def mlp(*extra: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), *extra, nn.Linear(256, 10))


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def parameter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_bytes_per_sample_is_the_slope_where_activations_set_the_peak() -> None:
    """Wide weights, narrow samples: below a few hundred samples Adam's step (temporaries the
    size of the weights) sets the peak, which then does not grow with the batch. The slope
    reported is what one more sample costs at the size found, measured by the probe."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 10))
    data = Pairs()
    flat = [probe(model, data, mse, b, CPU)[0] for b in (8, 16)]
    assert flat[1] - flat[0] < 8 * 1024  # the optimizer step's peak: hardly grows
    report = find_max_micro_batch(model, data, mse, CPU, capacity_bytes=30_000_000, limit=65536)
    found = report["max_micro_batch_size"]
    fits, _ = probe(model, data, mse, found, CPU)
    over, _ = probe(model, data, mse, found + 1, CPU)
    assert report["bytes_per_sample"] == pytest.approx(over - fits, rel=0.05)


def test_probe_peak_grows_affinely_with_the_micro_batch() -> None:
    model, data = mlp(), Pairs()
    sizes = [128, 256, 384, 512, 1024]
    peaks = {b: probe(model, data, mse, b, CPU, optimizer="none")[0] for b in sizes}
    slope = (peaks[256] - peaks[128]) / 128
    for b in sizes:
        assert peaks[b] == pytest.approx(peaks[128] + slope * (b - 128), rel=1e-3)
    # at least the batch, the hidden activations and their grads per sample
    assert slope >= 4 * (32 + 10 + 3 * 256)


def test_probe_counts_the_optimizer_state_exactly() -> None:
    model, data = mlp(), Pairs()
    weights = parameter_bytes(model)
    none, _ = probe(model, data, mse, 512, CPU, optimizer="none")
    sgd, _ = probe(model, data, mse, 512, CPU, optimizer="sgd")
    adam, _ = probe(model, data, mse, 512, CPU, optimizer="adam")
    assert none >= 2 * weights  # weights and grads
    assert sgd - none == weights  # one momentum buffer per parameter
    tensors = len(list(model.parameters()))
    assert adam - none == 2 * weights + 4 * tensors  # two moments, and a float32 step count each


def test_probe_leaves_the_model_weights_modes_grads_and_rng_as_it_found_them() -> None:
    model = mlp(nn.BatchNorm1d(256), nn.Dropout(0.5)).eval()
    model[0].weight.grad = torch.full_like(model[0].weight, 0.25)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    identities = [id(p) for p in model.parameters()]
    rng = torch.get_rng_state()
    peak, error = probe(model, Pairs(), mse, 100, CPU)
    assert error is None and peak > 0
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [id(p) for p in model.parameters()] == identities
    assert not any(m.training for m in model.modules())
    assert torch.equal(model[0].weight.grad, torch.full_like(model[0].weight, 0.25))
    assert all(p.grad is None for name, p in model.named_parameters() if name != "0.weight")
    assert torch.equal(torch.get_rng_state(), rng)


def test_probe_cycles_through_a_small_dataset() -> None:
    model = mlp()
    small, _ = probe(model, Pairs(size=3), mse, 200, CPU, optimizer="none")
    large, _ = probe(model, Pairs(size=500), mse, 200, CPU, optimizer="none")
    assert small == large  # memory depends on the shapes only


def test_finder_finds_the_largest_micro_batch_within_the_budget() -> None:
    model, data = mlp(), Pairs()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # a capacity whose budget lands between the peaks of two neighbouring sizes near 300
    peak_300, _ = probe(model, data, mse, 300, CPU)
    report = find_max_micro_batch(
        model, data, mse, CPU, capacity_bytes=int(peak_300 / 0.9) + 1000, limit=4096
    )
    b = report["max_micro_batch_size"]
    assert 295 <= b <= 305 and not report["hit_limit"]
    budget = report["budget_bytes"]
    assert budget == budget_bytes(report["capacity_bytes"], 0.1)
    fits, _ = probe(model, data, mse, b, CPU)
    over, _ = probe(model, data, mse, b + 1, CPU)
    assert fits <= budget < over
    assert report["peak_bytes_at_max"] == fits
    sizes = [t["micro_batch_size"] for t in report["trials"]]
    assert len(sizes) == len(set(sizes)) and sizes[:9] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert report["bytes_per_sample"] == pytest.approx((over - fits), rel=0.05)
    assert all(t["fits"] == (t["micro_batch_size"] <= b) for t in report["trials"])
    # a CPU trial stops at the budget rather than running to its full peak
    assert all(t["error"].startswith("BudgetExceeded") for t in report["trials"] if not t["fits"])
    assert json.loads(json.dumps(report)) == report
    assert set(report) == {
        "max_micro_batch_size", "capacity_bytes", "budget_bytes", "safety_margin", "device", "optimizer",
        "hit_limit", "peak_bytes_at_max", "bytes_per_sample", "trials", "seconds",
    }  # fmt: skip
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())


def test_finder_reports_hitting_the_limit() -> None:
    report = find_max_micro_batch(mlp(), Pairs(), mse, "cpu", capacity_bytes=1 << 34, limit=48)
    assert report["max_micro_batch_size"] == 48 and report["hit_limit"]
    assert [t["micro_batch_size"] for t in report["trials"]] == [1, 2, 4, 8, 16, 32, 48]


def test_finder_reports_zero_when_the_weights_alone_exceed_the_budget() -> None:
    model = mlp()
    report = find_max_micro_batch(model, Pairs(), mse, "cpu", capacity_bytes=parameter_bytes(model))
    assert report["max_micro_batch_size"] == 0 and report["peak_bytes_at_max"] is None
    assert len(report["trials"]) == 1 and not report["trials"][0]["fits"]


def test_cpu_capacity_is_required() -> None:
    with pytest.raises(ValueError, match="memory_bytes"):
        find_max_micro_batch(mlp(), Pairs(), mse, "cpu")


@pytest.mark.parametrize(
    "call",
    [
        lambda m, d: find_max_micro_batch(m, d, mse, "cpu", capacity_bytes=1 << 30, optimizer="lion"),
        lambda m, d: find_max_micro_batch(m, d, mse, "cpu", capacity_bytes=1 << 30, safety_margin=1.0),
        lambda m, d: find_max_micro_batch(m, d, mse, "cpu", capacity_bytes=1 << 30, limit=0),
        lambda m, d: probe(m, d, mse, 0, CPU),
        lambda m, d: probe(m, Pairs(size=0), mse, 4, CPU),
        lambda m, d: probe(m, d, mse, 4, "meta"),
    ],
)
def test_bad_arguments_are_rejected(call: Callable[[nn.Module, Dataset[Any]], object]) -> None:
    with pytest.raises(ValueError):
        call(mlp(), Pairs())


# --- running out of memory ------------------------------------------------------------------


class FailsAbove(nn.Module):
    """An MLP whose forward fails with `make_error()` above `threshold` samples."""

    def __init__(self, threshold: int, make_error: Callable[[], BaseException]) -> None:
        super().__init__()
        self.body = mlp()
        self.threshold = threshold
        self.make_error = make_error

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.threshold:
            raise self.make_error()
        out: torch.Tensor = self.body(x)
        return out


def huge_allocation() -> BaseException:
    """A real allocator failure: ask the CPU allocator for 4 EiB."""
    try:
        torch.empty(1 << 62, dtype=torch.uint8)
    except RuntimeError as error:
        return error
    raise AssertionError("the allocation was expected to fail")


@pytest.mark.parametrize(
    ("make_error", "text"),
    [
        (
            lambda: torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
            "OutOfMemoryError",
        ),
        (lambda: MemoryError("no room"), "MemoryError"),
        (huge_allocation, "DefaultCPUAllocator: can't allocate memory"),
    ],
)
def test_out_of_memory_means_the_size_does_not_fit(
    make_error: Callable[[], BaseException], text: str
) -> None:
    model = FailsAbove(47, make_error)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = find_max_micro_batch(model, Pairs(), mse, "cpu", capacity_bytes=1 << 34, limit=64)
    assert report["max_micro_batch_size"] == 47
    failed = [t for t in report["trials"] if not t["fits"]]
    assert failed and all(text in t["error"] for t in failed)
    assert all(t["error"] is None for t in report["trials"] if t["fits"])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_real_cpu_allocation_failure_is_recognised() -> None:
    assert is_out_of_memory(huge_allocation())


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (torch.cuda.OutOfMemoryError("CUDA out of memory"), True),
        (MemoryError(), True),
        (RuntimeError("CUDA error: out of memory"), True),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)"), False),
        (ValueError("out of memory"), False),
    ],
)
def test_which_errors_count_as_out_of_memory(error: BaseException, expected: bool) -> None:
    assert is_out_of_memory(error) is expected


def test_other_errors_propagate_and_the_model_is_still_restored() -> None:
    model = FailsAbove(5, lambda: ValueError("a bug in the model"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="a bug in the model"):
        find_max_micro_batch(model, Pairs(), mse, "cpu", capacity_bytes=1 << 34)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


# --- CUDA -----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA GPUs")
def test_finder_on_cuda() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    model, data = mlp().to(device), Pairs()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # the whole device: a small MLP reaches the limit
    report = find_max_micro_batch(model, data, mse, device, limit=1024)
    assert report["capacity_bytes"] == torch.cuda.mem_get_info(device)[1]
    assert report["max_micro_batch_size"] == 1024 and report["hit_limit"]
    # a capacity that holds only a few hundred samples: the allocator's peak decides
    peak_300, error = probe(model, data, mse, 300, device)
    assert error is None and peak_300 > 4 * parameter_bytes(model)
    report = find_max_micro_batch(model, data, mse, device, capacity_bytes=int(peak_300 / 0.9), limit=4096)
    b, budget = report["max_micro_batch_size"], report["budget_bytes"]
    assert 0 < b < 4096
    assert probe(model, data, mse, b, device)[0] <= budget < probe(model, data, mse, b + 1, device)[0]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
