"""How much device memory a training micro-step of a user's model needs: one trial (`probe`)
at one micro-batch size, measured by `memory_meter`. The search over sizes that
uses it is `micro_batch_fit`.

Peaks are absolute: everything the process holds on the device during the step, the
model's weights included, because that total is what has to fit.
"""

from __future__ import annotations

import gc
from collections.abc import Sized
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from app.contract.check_options import DEFAULT_FIT_OPTIMIZER, FIT_OPTIMIZERS
from app.worker.measure.memory_meter import BudgetExceeded, PeakMemory
from app.worker.training.workload import LossFn, collate, model_loss, to_device

# Substrings (lower case) of allocation failures torch raises as a plain RuntimeError:
# "DefaultCPUAllocator: can't allocate memory", "CUDA error: out of memory" (outside the
# caching allocator), "HIP/XPU/MPS ... out of memory", and cuBLAS/cuDNN failing to allocate
# their workspace, which is what an almost-full GPU often reports first.
_OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory", "_status_alloc_failed")
_ERROR_CHARS = 500


def check_optimizer(name: str) -> None:
    if name not in FIT_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(FIT_OPTIMIZERS)}, not {name!r}")


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


# Over 60 lines: one training step under the allocator's watch; setup, step and cleanup must share
# the try/finally that frees the device.
def probe(
    model: nn.Module,
    dataset: Dataset[Any],
    loss_fn: LossFn | None,
    micro_batch_size: int,
    device: torch.device | str,
    *,
    optimizer: str = DEFAULT_FIT_OPTIMIZER,
    stop_above_bytes: int | None = None,
) -> tuple[int, str | None]:
    """Peak bytes of training `model` at `micro_batch_size` on `device`, and the out-of-memory
    error text if it did not fit (then the peak is the one reached before the failure).

    Runs two micro-steps on one batch, each forward, loss, backward and (unless `optimizer` is
    "none") an optimizer step, without zeroing the grads: the second runs with the grads and
    optimizer state alive, as every later training step and every micro-step of gradient
    accumulation does, where a first step alone would create the optimizer state only after
    its activations are gone. The batch is `default_collate` of dataset items 0..b−1, cycling
    when b exceeds the dataset (memory depends only on the shapes); dict items and a None
    `loss_fn` are taken as `app.worker.training.workload` takes them.

    The model must already be on `device` and is trained in the train/eval modes it has.
    Its weights, buffers, grads, modes and the RNG state are restored afterwards.
    `stop_above_bytes` (CPU only) ends the trial with
    a `BudgetExceeded` error as soon as the live bytes pass it. Errors other than running
    out of memory propagate.
    """
    device = resolve_device(device)
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


def resolve_device(device: torch.device | str) -> torch.device:
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
    check_optimizer(optimizer)
    if not isinstance(dataset, Sized) or len(dataset) == 0:
        raise ValueError("the dataset must be a map-style dataset with at least one sample")
    elsewhere = {str(t.device) for t in [*model.parameters(), *model.buffers()] if t.device != device}
    if elsewhere:
        raise ValueError(
            f"the model has tensors on {', '.join(sorted(elsewhere))}: move it to {device} first"
        )


def _micro_steps(
    model: nn.Module, items: list[Any], loss_fn: LossFn | None, device: torch.device, optimizer: str
) -> None:
    # In the modes the factory left the modules in, as the check trains them.
    inputs, targets = collate(items)
    items.clear()  # the samples' own tensors are not part of the step once collated
    inputs, targets = to_device(inputs, device), to_device(targets, device)
    step = _optimizer(optimizer, [p for p in model.parameters() if p.requires_grad])
    try:
        for _ in range(2):
            loss = model_loss(model, loss_fn, inputs, targets)
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
