"""What a check trains: the built-in synthetic model, or a model an operator registered.

A registered factory is a callable `package.module:factory` that returns

    (model: torch.nn.Module, dataset: torch.utils.data.Dataset, loss_fn[, referee])

where `dataset[i]` is an `(input, target)` pair and `loss_fn(output, target)` is the mean
loss over a batch's samples (as torch's losses are by default). A factory that takes a
`seed` keyword gets the check's seed; either way the global RNG is seeded with it first.
The check builds batches with `default_collate`, so the model is called as `model(input)`;
the lr-scaling probe judges by the optional referee (app.worker.training.referee).

Hugging Face style: `dataset[i]` may be a dict of tensors (`input_ids`, `attention_mask`,
`labels`, ...); the model is then called as `model(**batch)` and `loss_fn(outputs,
batch["labels"])`, or, with `loss_fn` None, the model's own `outputs.loss` (the batch must
carry labels). Transformers' language-model losses average over the batch's tokens, not its
samples: equal to the per-sample mean only when every sample has as many labelled tokens.

The model is trained in the modes the factory left its modules in: a factory that puts its
batch norms or dropout in eval mode is checked that way (the check never calls `train()`).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from app.contract.model_registry import SYNTHETIC
from app.contract.targets import FactoryError, resolve
from app.worker.training.referee import Referee, referee_of
from app.worker.training.samplers import index_tensor
from app.worker.training.sync_batch_norm import as_batch_norm, training_sync_batch_norms
from app.worker.training.synthetic_model import batch_loss, build_model, half_squared_error, synthetic_batch

LossFn = Callable[[Any, Any], torch.Tensor]
# Set on an exception that the model's own code raised (its forward, loss or dataset): such
# a failure leaves the process group as it was, so the warm ranks can be kept.
MODEL_RAISED = "_batchplan_model_raised"


@contextlib.contextmanager
def model_code() -> Iterator[None]:
    """Marks an exception raised inside the block as the model's own (see MODEL_RAISED)."""
    try:
        yield
    except Exception as err:
        with contextlib.suppress(AttributeError, TypeError):
            setattr(err, MODEL_RAISED, True)
        raise


def raised_by_model(error: BaseException) -> bool:
    return bool(getattr(error, MODEL_RAISED, False))


def collate(items: list[Any]) -> tuple[Any, Any]:
    """A batch from dataset items: `(input, target)` pairs, or dicts (the whole dict is the
    input, its "labels" the target)."""
    from torch.utils.data import default_collate

    batch = default_collate(items)
    if isinstance(batch, Mapping):
        return dict(batch), batch.get("labels")
    x, y = batch
    return x, y


def call_model(module: nn.Module, x: Any) -> Any:
    return module(**x) if isinstance(x, Mapping) else module(x)


def model_loss(module: nn.Module, loss_fn: LossFn | None, x: Any, y: Any) -> torch.Tensor:
    """The mean loss of one batch: `loss_fn(outputs, target)`, or the model's own
    `outputs.loss` when there is no loss function."""
    outputs = call_model(module, x)
    if loss_fn is not None:
        return loss_fn(outputs, y)
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
    if not isinstance(loss, torch.Tensor):
        raise FactoryError(
            "the factory gave no loss function and the model returned no `loss`: give the batches "
            "`labels` or return a loss_fn"
        )
    return loss


def to_device(value: Any, device: torch.device, dtype: torch.dtype | None = None) -> Any:
    """Tensors (in tuples, lists and dicts too) to the device; floating ones to `dtype`."""
    if isinstance(value, torch.Tensor):
        cast = dtype if dtype is not None and value.is_floating_point() else value.dtype
        return value.to(device=device, dtype=cast)
    if isinstance(value, dict):
        return {k: to_device(v, device, dtype) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_device(v, device, dtype) for v in value)
    return value


class SyntheticDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """The synthetic samples as a dataset (for the micro-batch search): any index is one."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = synthetic_batch(torch.tensor([index]), self.seed, torch.float64, torch.device("cpu"))
        return x[0], y[0]


class Workload(ABC):
    """What a check trains, as the checks use it: fresh modules with the initial weights,
    batches by sample index, the loss. One of SyntheticWorkload, Registered or (the tokens
    check's) TokenWorkload."""

    def __init__(self, name: str, seed: int, dataset: Dataset[Any], loss_fn: LossFn | None) -> None:
        self.name = name
        self.seed = seed
        self.dataset = dataset
        self.loss_fn = loss_fn
        self.referee: Referee | None = None  # a factory's held-out set and metric

    @property
    def dataset_size(self) -> int | None:
        """How many samples the dataset has; None: any index is a sample."""
        return None

    @abstractmethod
    def module(self, dtype: torch.dtype | None, device: torch.device) -> nn.Module:
        """A fresh model with the initial weights (`dtype` None: the model's own)."""

    @abstractmethod
    def batch(
        self, indices: Sequence[int], dtype: torch.dtype | None, device: torch.device
    ) -> tuple[Any, Any]:
        """Inputs and targets of samples `indices`."""

    @abstractmethod
    def loss(self, module: nn.Module, x: Any, y: Any, reduction: str) -> torch.Tensor:
        """The batch's loss, its mean or its sum over the samples."""

    def forward(self, module: nn.Module, x: Any) -> Any:
        return module(x)

    def single_process_module(self, dtype: torch.dtype | None, device: torch.device) -> nn.Module:
        """A fresh model for one process alone: SyncBatchNorm layers as BatchNorm (the same
        function over the batch that process sees, with no peers to wait for)."""
        return as_batch_norm(self.module(dtype, device))

    @property
    def own_loss(self) -> bool:
        """Whether the loss is the model's own `outputs.loss` (Transformers style)."""
        return False

    @property
    def independent_samples(self) -> bool:
        """Whether a batch's mean loss is known to be the mean of each sample's loss alone (no
        layer, and no loss, that couples the samples): then a gradient is linear in per-sample
        weights however the samples are batched. Known only of the built-in model; a
        factory's may couple them (BatchNorm, a contrastive loss, an auxiliary load loss)."""
        return False


class SyntheticWorkload(Workload):
    """The built-in model: deterministic weights and samples, a pure function of the seed."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(SYNTHETIC, seed, SyntheticDataset(seed), half_squared_error)

    @property
    def independent_samples(self) -> bool:
        return True  # a linear pair and half the squared error per sample (synthetic_model)

    def module(self, dtype: torch.dtype | None, device: torch.device) -> nn.Module:
        return build_model(self.seed, dtype or torch.float64, device)

    def batch(
        self, indices: Sequence[int], dtype: torch.dtype | None, device: torch.device
    ) -> tuple[Any, Any]:
        return synthetic_batch(index_tensor(indices), self.seed, dtype or torch.float64, device)

    def loss(self, module: nn.Module, x: Any, y: Any, reduction: str) -> torch.Tensor:
        return batch_loss(module, x, y, reduction)


@dataclass(frozen=True, slots=True)
class Described:
    """What a registered model's factory built (app.contract.host.BuiltModel carries it)."""

    description: str
    parameters: int
    dataset_size: int | None
    model_class: str
    sync_batch_norm: tuple[str, ...]


class Registered(Workload):
    """A registered factory's (model, dataset, loss_fn), built once; each check trains a copy."""

    def __init__(self, name: str, target: str, seed: int = 0) -> None:
        self.target = target
        factory = self.factory = resolve(target)
        torch.manual_seed(seed)
        try:
            takes_seed = "seed" in inspect.signature(factory).parameters
        except (TypeError, ValueError):
            takes_seed = False
        try:
            built = factory(seed=seed) if takes_seed else factory()
        except Exception as err:
            raise FactoryError(f"{target} raised {type(err).__name__}: {err}") from err
        if not (isinstance(built, tuple | list) and len(built) in (3, 4)):
            shape = "(model, dataset, loss_fn), or with its referee fourth"
            raise FactoryError(f"{target} must return {shape}; it returned {type(built).__name__}")
        model, dataset, loss_fn = built[:3]
        if not isinstance(model, nn.Module):
            raise FactoryError(f"{target}: the model is a {type(model).__name__}, not a torch.nn.Module")
        if loss_fn is not None and not callable(loss_fn):
            raise FactoryError(f"{target}: the loss function is not callable (None: the model's own loss)")
        try:
            size = len(dataset)
        except TypeError as err:
            raise FactoryError(
                f"{target}: the dataset has no len(); a check needs a map-style dataset"
            ) from err
        super().__init__(name, seed, dataset, loss_fn)
        # Kept in the modes the factory chose: calling train() here would undo an eval-mode
        # batch norm or dropout, the very fixes the findings recommend.
        self.template = model
        self._size = int(size)
        self.referee = referee_of(target, built[3]) if len(built) == 4 else None

    @property
    def dataset_size(self) -> int | None:
        return self._size

    def module(self, dtype: torch.dtype | None, device: torch.device) -> nn.Module:
        fresh = copy.deepcopy(self.template).to(device)
        return fresh.to(dtype) if dtype is not None else fresh

    def batch(
        self, indices: Sequence[int], dtype: torch.dtype | None, device: torch.device
    ) -> tuple[Any, Any]:
        with model_code():
            x, y = collate([self.dataset[i] for i in indices])
        return to_device(x, device, dtype), to_device(y, device, dtype)

    def loss(self, module: nn.Module, x: Any, y: Any, reduction: str) -> torch.Tensor:
        with model_code():
            mean: torch.Tensor = model_loss(module, self.loss_fn, x, y)
        return mean if reduction == "mean" else mean * _batch_len(x)

    def forward(self, module: nn.Module, x: Any) -> Any:
        with model_code():
            return call_model(module, x)

    @property
    def own_loss(self) -> bool:
        return self.loss_fn is None

    def smoke_test(self) -> None:
        """A forward and backward pass on the first two samples, on CPU, in one process."""
        cpu = torch.device("cpu")
        module = self.single_process_module(None, cpu)
        x, y = self.batch(range(min(2, self._size)), None, cpu)
        with model_code():
            self.loss(module, x, y, "mean").backward()  # type: ignore[no-untyped-call]

    def describe(self) -> Described:
        doc = inspect.getdoc(self.factory) or ""
        return Described(
            description=doc.split("\n\n")[0].replace("\n", " "),
            parameters=sum(p.numel() for p in self.template.parameters()),
            dataset_size=self._size,
            model_class=type(self.template).__name__,
            sync_batch_norm=tuple(training_sync_batch_norms(self.template)),
        )


def _batch_len(x: Any) -> int:
    while isinstance(x, list | tuple | dict):
        x = next(iter(x.values())) if isinstance(x, dict) else x[0]
    return int(x.shape[0]) if isinstance(x, torch.Tensor) else 1


def load(name: str, target: str | None, seed: int) -> Workload:
    if name == SYNTHETIC or target is None:
        return SyntheticWorkload(seed)
    return Registered(name, target, seed)
