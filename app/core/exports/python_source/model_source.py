"""The python skeleton's model, data and loss, as source text written into it: the toy
placeholders a user replaces (each marked, so that the script says which are still in use), or,
with the export's `model_factory`, the user's factory imported and called as batchplan's checks
call it (app.worker.training.workload: `(model, dataset, loss_fn)`, `seed=` when it takes one).

The script is a file users copy: the factory is imported by name where it runs, never by this
project, which imports no user code."""

from __future__ import annotations

from app.core.exports.parts.export_types import ExportInput, ExportUnsupported
from app.core.exports.parts.python_literal import py_literal

PLACEHOLDERS = '''
def placeholder(function):
    """Marks this skeleton's stand-ins for your model, data and loss: main() names those still in use."""
    function.placeholder = True
    return function


@placeholder
def build_dataset() -> Dataset:
    """A PLACEHOLDER to replace: return your training Dataset of (input, target) pairs."""
    if TOY and LOSS_NORMALIZATION == "token":
        # Token sequences of 8 with 1 to 8 valid tokens; the rest is padding the loss ignores.
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(1, 16, (4 * GLOBAL_BATCH_SIZE, 8), generator=generator)
        lengths = torch.randint(1, 9, (len(ids), 1), generator=generator)
        labels = torch.where(torch.arange(8) < lengths, ids.roll(-1, dims=1), IGNORE_INDEX)
        return TensorDataset(ids, labels)
    if TOY:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(4 * GLOBAL_BATCH_SIZE, 8, generator=generator)
        y = x @ torch.randn(8, 1, generator=generator) + 0.1 * torch.randn(len(x), 1, generator=generator)
        return TensorDataset(x, y)
    raise NotImplementedError("build_dataset(): return your training Dataset (or set BATCHPLAN_TOY=1)")


@placeholder
def build_model() -> nn.Module:
    """A PLACEHOLDER to replace: return your model."""
    if TOY and LOSS_NORMALIZATION == "token":
        return nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))
    if TOY:
        return nn.Linear(8, 1)
    raise NotImplementedError("build_model(): return your model (or set BATCHPLAN_TOY=1)")


@placeholder
def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A PLACEHOLDER to replace with your loss (the toy's mean squared error, or token cross-entropy)."""
    if LOSS_NORMALIZATION == "token":
        # Summed over valid tokens: with_loss_scales divides by the step's global count.
        return nn.functional.cross_entropy(
            output.flatten(0, -2), target.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
    # The plan's loss scales assume this reduction.
    return nn.functional.mse_loss(output, target, reduction=LOSS_REDUCTION)
'''.strip("\n")

_FACTORY = '''
# ---- your model: a factory returning (model, dataset, loss_fn), as `batchplan check` builds it ----
MODEL_FACTORY = __FACTORY__  # importable where this script runs (docs/your-own-model.md)
_BUILT: list = []


def built() -> tuple:
    """The factory's (model, dataset, loss_fn), built once per process from the sampler's seed.
    A fourth element (its held-out referee, for the lr probe) is not used here."""
    if not _BUILT:
        import importlib
        import inspect

        module, _, name = MODEL_FACTORY.partition(":")
        factory = importlib.import_module(module)
        for part in name.split("."):
            factory = getattr(factory, part)
        torch.manual_seed(SEED)
        out = factory(seed=SEED) if "seed" in inspect.signature(factory).parameters else factory()
        if not isinstance(out, (tuple, list)) or len(out) not in (3, 4):
            raise SystemExit(f"{MODEL_FACTORY}: return (model, dataset, loss_fn), not {type(out).__name__}")
        model, dataset, loss = out[:3]
        # This loop trains (input, target) pairs: a model that computes its own loss from a
        # dict batch (Transformers' outputs.loss) needs a loop that calls model(**batch).
        if loss is None or isinstance(dataset[0], dict):
            raise SystemExit(f"{MODEL_FACTORY}: this skeleton trains (input, target) pairs with a loss_fn; "
                             "a model that computes its own loss from dict batches needs its own loop")
        _BUILT.append((model, dataset, loss))
    return _BUILT[0]


def build_dataset() -> Dataset:
    return built()[1]


def build_model() -> nn.Module:
    return built()[0]


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    # A factory's loss is the mean over the micro-batch; the plan's loss scales of a summed
    # loss expect the sum.
    loss = built()[2](output, target)
    return loss * len(target) if LOSS_REDUCTION == "sum" else loss
'''.strip("\n")


def model_source(x: ExportInput, mesh_or_packed: bool) -> str:
    """The skeleton's build_dataset, build_model and loss_fn: the placeholders, or the export's
    factory. Refused, naming the option, where the plain loop cannot train a factory's model."""
    factory = x.options.model_factory
    if factory is None:
        return PLACEHOLDERS
    p = x.plan
    why = (
        "a packed or mesh plan writes its own loop"
        if mesh_or_packed
        else "the plan normalises the loss per token, a factory's loss is a mean per micro-batch"
        if p.tokens is not None and p.tokens.loss_normalization == "token"
        else None
    )
    if why is not None:
        raise ExportUnsupported(
            f"model_factory {factory}: the python export builds a factory's model "
            f"into its plain DDP loop only, and {why}; export without model_factory and put your "
            "model, data and loss into the skeleton's build_model(), build_dataset() and loss_fn()",
            pointer="/query/model_factory",
        )
    return _FACTORY.replace("__FACTORY__", py_literal(factory))
