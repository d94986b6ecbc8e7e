"""How much device memory a training micro-step of a user's model needs, and the largest
micro-batch that fits.

The order of the trials is the pure `app.core.micro_batch_search`; this module measures
them. On CUDA the caching allocator keeps a peak statistic; on CPU there is none, so a
dispatch mode counts the bytes of live tensor storage instead (`LiveTensorTracker`).

Peaks are absolute: everything the process holds on the device during the step, the
model's weights included, because that total is what has to fit.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sized
from functools import partial
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import Dataset, default_collate

from app.core.micro_batch_search import (
    Trial,
    affine_bytes_per_sample,
    budget_bytes,
    search_max_micro_batch,
)
from app.worker.workload import to_device

LossFn = Callable[[Any, Any], torch.Tensor]
OPTIMIZERS = ("adam", "adamw", "sgd", "none")

# Substrings (lower case) of allocation failures torch raises as a plain RuntimeError:
# "DefaultCPUAllocator: can't allocate memory", "CUDA error: out of memory" (outside the
# caching allocator), "HIP/XPU/MPS ... out of memory", and cuBLAS/cuDNN failing to allocate
# their workspace, which is what an almost-full GPU often reports first.
_OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory", "_status_alloc_failed")
_ERROR_CHARS = 500


class BudgetExceeded(MemoryError):
    """The live tensor bytes passed the tracker's stop level; raised so that a CPU trial
    stops there instead of allocating all the host memory a too-large batch would take."""


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` means the step did not fit: torch's OutOfMemoryError, Python's
    MemoryError, or a RuntimeError whose message says an allocation failed."""
    if isinstance(error, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    if isinstance(error, RuntimeError):
        message = str(error).lower()
        return any(text in message for text in _OOM_MESSAGES)
    return False


def describe_error(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 1] + "…"


def release_memory(device: torch.device) -> None:
    """Collect the cycles an aborted step leaves (its frames hold activations) and, on CUDA,
    give cached blocks back, so the next trial starts from the same state as the first."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class LiveTensorTracker(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves the mode unannotated
    """Live bytes of tensor storage created by torch ops while the mode is active, and their peak.

    Every op output that is new memory (its schema says it aliases no input) is counted once
    per storage (by data pointer, so views and in-place results are not counted again) and
    uncounted when the storage dies, through a weakref callback. The mode sits below autograd,
    so the backward pass and the optimizer step are seen too. Tensors alive before the mode
    (the model's weights) are counted with `track`.

    It cannot see memory that is not an op output: a kernel's scratch space, allocator
    rounding and fragmentation, the Python objects, or a storage grown in place (`resize_`,
    `out=` arguments).
    """

    def __init__(self, *, stop_above_bytes: int | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.stop_above_bytes = stop_above_bytes
        self.live_bytes = 0
        self.peak_bytes = 0
        self._live: dict[int, tuple[int, weakref.ref[torch.UntypedStorage]]] = {}
        # Storages can die on autograd's worker threads; their callbacks update the counts.
        self._lock = threading.Lock()

    def track(self, tensors: Iterable[torch.Tensor]) -> None:
        for tensor in tensors:
            self._add(tensor)

    def tracks(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor`'s storage is counted among the live bytes."""
        entry = self._live.get(tensor.untyped_storage().data_ptr())
        return entry is not None and entry[1]() is not None

    def _add(self, tensor: torch.Tensor) -> None:
        if tensor.is_meta or tensor.layout != torch.strided:
            return
        storage = tensor.untyped_storage()
        nbytes, pointer = storage.nbytes(), storage.data_ptr()
        if nbytes == 0 or pointer == 0:
            return
        with self._lock:
            entry = self._live.get(pointer)
            if entry is not None:
                if entry[1]() is not None:
                    return
                # A dead storage at a reused address whose callback has not run yet: its
                # callback will find the new entry and leave it, so settle the old one here.
                self.live_bytes -= entry[0]
            reference = weakref.ref(storage, partial(self._release, pointer))
            self._live[pointer] = (nbytes, reference)
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _release(self, pointer: int, reference: weakref.ref[torch.UntypedStorage]) -> None:
        with self._lock:
            entry = self._live.get(pointer)
            if entry is not None and entry[1] is reference:
                del self._live[pointer]
                self.live_bytes -= entry[0]

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        schema = getattr(func, "_schema", None)
        returns = list(schema.returns) if schema is not None else []
        values = [out] if len(returns) <= 1 else list(out)
        for index, value in enumerate(values):
            aliases = index < len(returns) and returns[index].alias_info is not None
            # lift_fresh "returns its input", but that input is the tensor torch.tensor() just built
            if aliases and func is not torch.ops.aten.lift_fresh.default:
                continue
            for tensor in value if isinstance(value, list | tuple) else (value,):
                if isinstance(tensor, torch.Tensor):
                    self._add(tensor)
        if self.stop_above_bytes is not None and self.live_bytes > self.stop_above_bytes:
            raise BudgetExceeded(
                f"live tensor memory reached {self.live_bytes} bytes, above the budget of "
                f"{self.stop_above_bytes} bytes; the trial stopped there"
            )
        return out


class PeakMemory:
    """Context manager: the peak bytes allocated on `device` while its block ran.

    CUDA: the caching allocator's `max_memory_allocated`, reset on entry, so it is absolute
    (everything this process holds on the device, not only what the block added) and it
    leaves out the cached-but-free blocks and fragmentation the safety margin has to cover.
    CPU: a `LiveTensorTracker` seeded with `resident`, the tensors the block's memory is
    added to. `peak_bytes` is readable after the block ends, also when it raised: then it is
    the peak before the failure, a lower bound.
    """

    def __init__(
        self,
        device: torch.device,
        *,
        resident: Iterable[torch.Tensor] = (),
        stop_above_bytes: int | None = None,
    ) -> None:
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"peak memory is measured on cpu and cuda devices, not {device.type}")
        self.device = device
        self.peak_bytes = 0
        self._tracker: LiveTensorTracker | None = None
        if device.type == "cpu":
            self._tracker = LiveTensorTracker(stop_above_bytes=stop_above_bytes)
            self._tracker.track(resident)

    def __enter__(self) -> PeakMemory:
        if self._tracker is not None:
            self._tracker.__enter__()  # type: ignore[no-untyped-call]
        else:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._tracker is not None:
            self._tracker.__exit__(exc_type, exc, traceback)  # type: ignore[no-untyped-call]
            self.peak_bytes = self._tracker.peak_bytes
        else:
            # The allocator's statistics are kept on the host at allocation time; no sync needed.
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))


def probe(
    model: nn.Module,
    dataset: Dataset[Any],
    loss_fn: LossFn,
    micro_batch_size: int,
    device: torch.device | str,
    *,
    optimizer: str = "adam",
    stop_above_bytes: int | None = None,
) -> tuple[int, str | None]:
    """Peak bytes of training `model` at `micro_batch_size` on `device`, and the out-of-memory
    error text if it did not fit (then the peak is the one reached before the failure).

    Runs two micro-steps on one batch, each forward, loss, backward and (unless `optimizer` is
    "none") an optimizer step, without zeroing the grads: the second runs with the grads and
    optimizer state alive, as every later training step and every micro-step of gradient
    accumulation does, where a first step alone would create the optimizer state only after
    its activations are gone. The batch is `default_collate` of dataset items 0..b−1, cycling
    when b exceeds the dataset (memory depends only on the shapes).

    The model must already be on `device`. Its weights, buffers, grads, train/eval modes and
    the RNG state are restored afterwards. `stop_above_bytes` (CPU only) ends the trial with
    a `BudgetExceeded` error as soon as the live bytes pass it. Errors other than running
    out of memory propagate.
    """
    device = _resolve(device)
    _check_probe_arguments(model, dataset, micro_batch_size, device, optimizer)
    weights = {
        key: value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else value
        for key, value in model.state_dict().items()
    }
    # Copies live on the host so that they do not count against the device being measured.
    grads = [
        (parameter, None if parameter.grad is None else parameter.grad.detach().to("cpu", copy=True))
        for parameter in model.parameters()
    ]
    modes = [(module, module.training) for module in model.modules()]
    for parameter in model.parameters():
        parameter.grad = None
    meter = PeakMemory(
        device,
        resident=[*model.parameters(), *model.buffers()],
        stop_above_bytes=stop_above_bytes if device.type == "cpu" else None,
    )
    error: str | None = None
    stopped = False
    try:
        with torch.random.fork_rng(devices=[device.index] if device.type == "cuda" else []):
            try:
                # Fetched outside the meter: a Python-level __getitem__ costs dispatch time
                # per item under the CPU tracker, and only the collated batch is device memory.
                count = len(dataset)  # type: ignore[arg-type]  # checked to be Sized above
                items = [dataset[i % count] for i in range(micro_batch_size)]
                with meter:
                    _micro_steps(model, items, loss_fn, device, optimizer)
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                error = describe_error(exc)
                stopped = isinstance(exc, BudgetExceeded)
    finally:
        for parameter in model.parameters():
            parameter.grad = None
        # On CUDA garbage left for later would count in the next trial's absolute peak; on
        # CPU the next tracker does not see it, and a full collection costs ~0.1–0.3 s, so
        # collect there only after a real allocation failure (a tracker stop leaves no
        # cycles of its own).
        if device.type == "cuda" or (error is not None and not stopped):
            release_memory(device)
        with torch.no_grad():
            model.load_state_dict(weights)
        for parameter, grad in grads:
            parameter.grad = None if grad is None else grad.to(parameter.device)
        for module, training in modes:
            module.train(training)
    return meter.peak_bytes, error


def find_max_micro_batch(
    model: nn.Module,
    dataset: Dataset[Any],
    loss_fn: LossFn,
    device: torch.device | str,
    *,
    capacity_bytes: int | None = None,
    safety_margin: float = 0.1,
    limit: int = 65536,
    optimizer: str = "adam",
) -> dict[str, Any]:
    """The largest micro-batch in [1, limit] whose training step peaks within
    `budget_bytes(capacity_bytes, safety_margin)` without running out of memory.

    On CUDA the capacity defaults to the device's total memory; on CPU it must be given.
    On CPU a trial also stops as soon as it passes the budget, so that the search never
    takes much more host memory than the budget. The model must already be on `device`.

    Returns a JSON-able report: max_micro_batch_size (0 when even 1 does not fit),
    capacity_bytes, budget_bytes, safety_margin, device, optimizer, hit_limit (the limit fit,
    the real maximum may be larger), peak_bytes_at_max, bytes_per_sample (slope of the peaks
    of the trials that ran to the end; None with fewer than two), trials (micro_batch_size,
    fits, peak_bytes, error, in the order they ran) and seconds.
    """
    started = time.perf_counter()
    device = _resolve(device)
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {optimizer!r}")
    if capacity_bytes is None:
        if device.type != "cuda":
            raise ValueError(
                f"a {device.type} device has no memory size torch can read: pass capacity_bytes "
                "(the request's memory_bytes), the memory one device may use"
            )
        capacity_bytes = int(torch.cuda.mem_get_info(device)[1])
    budget = budget_bytes(capacity_bytes, safety_margin)
    stop = budget if device.type == "cpu" else None

    def try_size(size: int) -> Trial:
        peak, error = probe(model, dataset, loss_fn, size, device, optimizer=optimizer, stop_above_bytes=stop)
        return Trial(
            micro_batch_size=size, fits=error is None and peak <= budget, peak_bytes=peak, error=error
        )

    result = search_max_micro_batch(try_size, limit=limit)
    at_max = [t.peak_bytes for t in result.trials if t.micro_batch_size == result.max_micro_batch_size]
    # Only trials that ran to the end measured their whole peak.
    complete = [(t.micro_batch_size, t.peak_bytes) for t in result.trials if t.error is None and t.peak_bytes]
    slope = affine_bytes_per_sample(complete)
    return {
        "max_micro_batch_size": result.max_micro_batch_size,
        "capacity_bytes": capacity_bytes,
        "budget_bytes": budget,
        "safety_margin": safety_margin,
        "device": str(device),
        "optimizer": optimizer,
        "hit_limit": result.hit_limit,
        "peak_bytes_at_max": at_max[0] if at_max else None,
        "bytes_per_sample": None if slope is None else round(slope),
        "trials": [
            {
                "micro_batch_size": t.micro_batch_size,
                "fits": t.fits,
                "peak_bytes": t.peak_bytes,
                "error": t.error,
            }
            for t in result.trials
        ],
        "seconds": round(time.perf_counter() - started, 3),
    }


def _resolve(device: torch.device | str) -> torch.device:
    resolved = torch.device(device)
    if resolved.type == "cuda" and resolved.index is None:
        # Allocator statistics and the RNG are per device: pin the one "cuda" means now.
        resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def _check_probe_arguments(
    model: nn.Module, dataset: Dataset[Any], micro_batch_size: int, device: torch.device, optimizer: str
) -> None:
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be an integer of at least 1, not {micro_batch_size!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {optimizer!r}")
    if not isinstance(dataset, Sized) or len(dataset) == 0:
        raise ValueError("the dataset must be a map-style dataset with at least one sample")
    elsewhere = {str(t.device) for t in [*model.parameters(), *model.buffers()] if t.device != device}
    if elsewhere:
        raise ValueError(
            f"the model has tensors on {', '.join(sorted(elsewhere))}: move it to {device} first"
        )


def _micro_steps(
    model: nn.Module, items: list[Any], loss_fn: LossFn, device: torch.device, optimizer: str
) -> None:
    model.train()
    inputs, targets = default_collate(items)
    items.clear()  # the samples' own tensors are not part of the step once collated
    inputs, targets = to_device(inputs, device), to_device(targets, device)
    step = _optimizer(optimizer, [p for p in model.parameters() if p.requires_grad])
    try:
        for _ in range(2):
            loss = loss_fn(model(inputs), targets)
            loss.backward()  # type: ignore[no-untyped-call]
            del loss
            if step is not None:
                step.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # asynchronous kernel failures surface inside the trial
    finally:
        if step is not None:
            # Adam sits in a reference cycle, so its state would outlive the trial until the
            # next garbage collection; cleared here, it is freed now.
            step.state.clear()


def _optimizer(name: str, parameters: list[nn.Parameter]) -> torch.optim.Optimizer | None:
    # The learning rate is irrelevant (the weights are restored); the state is what counts:
    # Adam and AdamW keep two tensors per parameter, SGD with momentum one.
    if name == "none" or not parameters:
        return None
    if name == "adam":
        return torch.optim.Adam(parameters, lr=1e-3)
    if name == "adamw":
        return torch.optim.AdamW(parameters, lr=1e-3)
    return torch.optim.SGD(parameters, lr=1e-3, momentum=0.9)
