"""What a packed or budgeted `tokens` check trains: seeded documents of random lengths, laid out
as the plan's `packing` says, and the tiny language model that attends within each document.

A micro-batch is one flattened row, as Hugging Face's DataCollatorWithFlattening makes it:
`input_ids`, `position_ids` restarting at 0 for each document, and `labels` whose first position
of every document is -100, so that a row of T positions holding k documents has T - k targets.
Under `rows` the rank's micro-batches are micro_batch_size rows of sequence_length positions
each (a document that does not fit is cut), flattened by the real collator; under
`token_budget` its samples fill micro-batches, in order, up to max_tokens_per_micro_batch, so
ranks run different numbers of micro-batches.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from app.contract.packed import PACKED_STEPS, collator_refusal
from app.contract.spec import CheckSpec
from app.contract.spec_error import SpecError
from app.core.records.plan_request import PackingMode
from app.core.tokens.packing import longest_document
from app.worker.training.synthetic_model import backward, flat_gradient
from app.worker.training.token_model import IGNORE_INDEX, VOCABULARY, TinyLanguageModel, TokenSequences
from app.worker.training.workload import Workload

_MODE_POINTER = "/plan/packing/mode"

MicroBatch = dict[str, torch.Tensor]  # input_ids, labels, position_ids: each (1, tokens)


class PackedLanguageModel(TinyLanguageModel):
    """TinyLanguageModel whose running mean restarts at every document (position_ids 0), so no
    document sees another packed before it in the row; the same weights and, on one document
    alone, the same function."""

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embedding(input_ids)
        length = x.shape[1]
        where = torch.arange(length, device=x.device).expand(x.shape[0], length)
        if position_ids is None:
            position_ids = where
        running = x.cumsum(dim=1)
        before = (where - position_ids - 1).clamp(min=0)  # the position just before the document
        prior = running.gather(1, before.unsqueeze(-1).expand_as(running))
        prior = prior * (where >= position_ids + 1).unsqueeze(-1).to(x.dtype)  # 0 at a row's start
        counts = (position_ids + 1).unsqueeze(-1).to(x.dtype)
        logits: torch.Tensor = self.head(torch.tanh(self.layer((running - prior) / counts)))
        return logits


def refuse_packed(spec: CheckSpec) -> None:
    """Raises SpecError where a packed check cannot run on this install."""
    if spec.packing is not None and spec.packing.mode is PackingMode.ROWS:
        try:
            from transformers import DataCollatorWithFlattening  # noqa: F401
        except ImportError as err:
            raise SpecError(collator_refusal(f"cannot be imported ({err})") or "", _MODE_POINTER) from None


def _documents(seed: int, step: int, replica: int, longest: int) -> Any:
    """An endless seeded stream of documents (token id lists), 2 to `longest` tokens each."""
    generator = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_009 + replica)
    while True:
        length = int(torch.randint(min(2, longest), longest + 1, (1,), generator=generator))
        yield torch.randint(1, VOCABULARY, (length,), generator=generator).tolist()


def flatten(documents: Sequence[list[int]]) -> MicroBatch:
    """The collator's layout, for token-budget micro-batches (no transformers needed)."""
    ids = [t for d in documents for t in d]
    labels = [t if i else IGNORE_INDEX for d in documents for i, t in enumerate(d)]
    positions = [i for d in documents for i in range(len(d))]
    return {
        "input_ids": torch.tensor([ids]),
        "labels": torch.tensor([labels]),
        "position_ids": torch.tensor([positions]),
    }


def _rows(stream: Any, rows: int, sequence_length: int) -> list[list[int]]:
    pieces: list[list[int]] = []
    for _ in range(rows):
        room = sequence_length
        while room:
            piece = next(stream)[:room]
            pieces.append(piece)
            room -= len(piece)
    return pieces


def _collate(pieces: list[list[int]]) -> MicroBatch:
    from transformers import DataCollatorWithFlattening

    batch = DataCollatorWithFlattening(return_tensors="pt")([{"input_ids": p} for p in pieces])
    return {k: batch[k] for k in ("input_ids", "labels", "position_ids")}


def _budgeted(stream: Any, samples: int, budget: int) -> list[MicroBatch]:
    batches: list[list[list[int]]] = []
    filled = budget
    for _ in range(samples):
        document = next(stream)
        if filled + len(document) > budget:
            batches.append([])
            filled = 0
        batches[-1].append(document)
        filled += len(document)
    return [flatten(b) for b in batches]


def step_micro_batches(spec: CheckSpec, step: int, replica: int) -> list[MicroBatch]:
    """Replica `replica`'s micro-batches in step `step`, as the plan lays them out."""
    packing = spec.packing
    assert packing is not None and spec.sequence_length is not None
    seq = spec.sequence_length
    stream = _documents(spec.seed, step, replica, longest_document(packing, seq))
    micro, g = spec.micro_batch_sizes()[replica], spec.gradient_accumulation_steps
    if packing.mode is PackingMode.ROWS:
        return [_collate(_rows(stream, micro, seq)) for _ in range(g)]
    assert packing.max_tokens_per_micro_batch is not None
    return _budgeted(stream, micro * g, packing.max_tokens_per_micro_batch)


def targets(batch: MicroBatch) -> int:
    """Valid targets, counted after the shift as the Trainer counts num_items_in_batch."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def documents(batch: MicroBatch) -> int:
    return int((batch["position_ids"] == 0).sum())


def packed_loss(module: nn.Module, batch: MicroBatch, reduction: str) -> torch.Tensor:
    """Cross-entropy over the row's targets, shifted as a causal model's loss shifts."""
    logits = module(batch["input_ids"], batch["position_ids"])
    return functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]),
        batch["labels"][:, 1:].reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum" if reduction == "sum" else "mean",
    )


class PackedWorkload(Workload):
    """The packed micro-batches of every replica and step, by index `(step, replica, k)`."""

    def __init__(self, spec: CheckSpec) -> None:
        torch.manual_seed(spec.seed)  # TinyLanguageModel's weights, as the tokens workload's
        self.template = PackedLanguageModel()
        assert spec.sequence_length is not None
        super().__init__("tokens", spec.seed, TokenSequences(spec.seed, spec.sequence_length), None)
        self.spec = spec
        self.micro_batches = {
            (s, r): step_micro_batches(spec, s, r)
            for s in range(PACKED_STEPS)
            for r in range(spec.data_parallel_size)
        }

    def module(self, dtype: torch.dtype | None, device: torch.device) -> nn.Module:
        return copy.deepcopy(self.template).to(device=device, dtype=dtype or torch.float64)

    def batch(
        self, indices: Sequence[int], dtype: torch.dtype | None, device: torch.device
    ) -> tuple[Any, Any]:
        step, replica, k = indices
        micro_batch = self.micro_batches[(step, replica)][k]
        return {key: t.to(device) for key, t in micro_batch.items()}, None

    def loss(self, module: nn.Module, x: Any, y: Any, reduction: str) -> torch.Tensor:
        return packed_loss(module, x, reduction)

    def reference_gradient(self, step: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """One process, every document of the step alone (no packing), the mean over all their
        targets: what the packed step must equal."""
        module = self.module(dtype, device)
        total = torch.zeros((), dtype=dtype, device=device)
        count = 0
        for r in range(self.spec.data_parallel_size):
            for batch in self.micro_batches[(step, r)]:
                starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist()
                for a, b in zip(starts, [*starts[1:], batch["input_ids"].shape[1]], strict=True):
                    alone = {k: t[:, a:b].to(device) for k, t in batch.items()}
                    alone["position_ids"] = torch.arange(b - a, device=device).view(1, -1)
                    if b - a > 1:
                        total = total + packed_loss(module, alone, "sum")
                    count += b - a - 1
        backward(total / count)
        return flat_gradient(module).detach()
