"""The micro-batch finder: the CPU live-memory tracker against known allocations, the probe's
training step, and the whole search on real models (its pure search order:
tests/core/test_micro_batch_search.py; running out of memory: test_out_of_memory.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
from memory_models import Pairs, mlp, mse, parameter_bytes
from torch import nn
from torch.utils.data import Dataset

from app.core.split.micro_batch_search import budget_bytes
from app.worker.measure.memory import probe
from app.worker.measure.memory_meter import LiveTensorTracker, PeakMemory
from app.worker.measure.micro_batch_fit import find_max_micro_batch
from tests.support.fit_report import found_report

MIB = 1024 * 1024
CPU = torch.device("cpu")


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


def test_bytes_per_sample_is_the_slope_where_activations_set_the_peak() -> None:
    """Wide weights, narrow samples: below a few hundred samples Adam's step (temporaries the
    size of the weights) sets the peak, which then does not grow with the batch. The slope
    reported is what one more sample costs at the size found, measured by the probe."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 10))
    data = Pairs()
    flat = [probe(model, data, mse, b, CPU)[0] for b in (8, 16)]
    assert flat[1] - flat[0] < 8 * 1024  # the optimizer step's peak: hardly grows
    report = found_report(model, data, mse, CPU, capacity_bytes=30_000_000, limit=65536)
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
    report = found_report(model, data, mse, CPU, capacity_bytes=int(peak_300 / 0.9) + 1000, limit=4096)
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
    report = found_report(mlp(), Pairs(), mse, "cpu", capacity_bytes=1 << 34, limit=48)
    assert report["max_micro_batch_size"] == 48 and report["hit_limit"]
    assert [t["micro_batch_size"] for t in report["trials"]] == [1, 2, 4, 8, 16, 32, 48]


def test_finder_reports_zero_when_the_weights_alone_exceed_the_budget() -> None:
    model = mlp()
    report = found_report(model, Pairs(), mse, "cpu", capacity_bytes=parameter_bytes(model))
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


# --- CUDA -----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA GPUs")
def test_finder_on_cuda() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    model, data = mlp().to(device), Pairs()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # the whole device: a small MLP reaches the limit
    report = found_report(model, data, mse, device, limit=1024)
    assert report["capacity_bytes"] == torch.cuda.mem_get_info(device)[1]
    assert report["max_micro_batch_size"] == 1024 and report["hit_limit"]
    # a capacity that holds only a few hundred samples: the allocator's peak decides
    peak_300, error = probe(model, data, mse, 300, device)
    assert error is None and peak_300 > 4 * parameter_bytes(model)
    report = found_report(model, data, mse, device, capacity_bytes=int(peak_300 / 0.9), limit=4096)
    b, budget = report["max_micro_batch_size"], report["budget_bytes"]
    assert 0 < b < 4096
    assert probe(model, data, mse, b, device)[0] <= budget < probe(model, data, mse, b + 1, device)[0]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
