"""Running out of memory during the micro-batch search: which errors mean a size does not fit
(a real CPU allocator failure among them), and that any other error propagates with the model
restored."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from memory_models import Pairs, mlp, mse
from torch import nn

from app.worker.measure.memory import is_out_of_memory
from app.worker.measure.micro_batch_fit import find_max_micro_batch
from tests.support.fit_report import found_report


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
    report = found_report(model, Pairs(), mse, "cpu", capacity_bytes=1 << 34, limit=64)
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
