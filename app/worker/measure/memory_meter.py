"""The peak bytes a block of torch work allocates on a device.

On CUDA the caching allocator keeps a peak statistic; on CPU there is none, so a dispatch
mode counts the bytes of live tensor storage instead (`LiveTensorTracker`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from functools import partial
from types import TracebackType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class BudgetExceeded(MemoryError):
    """The live tensor bytes passed the tracker's stop level; raised so that a CPU trial
    stops there instead of allocating all the host memory a too-large batch would take."""


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
