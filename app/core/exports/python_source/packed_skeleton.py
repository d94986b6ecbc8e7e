"""The `python` export of a packed or budgeted plan: a DDP loop whose micro-batches are flattened
rows of documents (DataCollatorWithFlattening's layout), each rank summing its per-target losses
over every micro-batch of the step, times the world size over the step's all-reduced targets."""

from __future__ import annotations

from app.core.errors.domain import InvalidValue
from app.core.exports.parts.common import require_data_parallel, summary
from app.core.exports.parts.export_types import Export, ExportInput
from app.core.exports.parts.python_literal import py_literal
from app.core.exports.parts.recipe_code import lr_block, optimizer_call, recipe, scheduler_call
from app.core.tokens.packing import longest_document

_SKELETON = '''"""__SUMMARY__

Packed: every micro-batch is one row of whole documents (a document's first position is never a
target), so ranks hold unequal targets and, under a token budget, unequal micro-batch counts.
Exact: each rank sums its per-target losses, times world / N, N the step's targets all-reduced
before the first backward; all but a rank's last micro-batch run under no_sync, one synchronised
backward a step whatever its count. Run: torchrun --nproc-per-node __NPROC__ train.py
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

# ---- the plan: change it by planning again, not by hand --------------------------------
DATA_PARALLEL_SIZE = __WORLD__
GRADIENT_ACCUMULATION_STEPS = __ACCUM__
MICRO_BATCH_SIZE = __MICRO__  # rows of SEQUENCE_LENGTH a micro-batch (rows), or samples (budget)
SEQUENCE_LENGTH = __SEQ__
PACKING = __PACKING__  # "rows" or "token_budget"
MAX_TOKENS_PER_MICRO_BATCH = __BUDGET__  # token_budget: a micro-batch is filled up to this
LONGEST_DOCUMENT = __LONGEST__
TRAIN_STEPS = __TRAIN_STEPS__
SEED = __SEED__
IGNORE_INDEX = -100
LR = __LR__


__LR_FUNCTION__


TOY = os.environ.get("BATCHPLAN_TOY") == "1"


def documents(rank: int, world: int):
    """This rank's documents (lists of token ids), in order: every rank its own share."""
    if TOY:
        generator = torch.Generator().manual_seed(SEED * 1_000 + rank)
        while True:
            shortest = min(2, LONGEST_DOCUMENT)
            length = int(torch.randint(shortest, LONGEST_DOCUMENT + 1, (1,), generator=generator))
            yield torch.randint(1, 16, (length,), generator=generator).tolist()
    raise NotImplementedError("documents(): yield your tokenised documents (or set BATCHPLAN_TOY=1)")


def flatten(docs: list[list[int]]) -> dict[str, torch.Tensor]:
    """One row, as transformers' DataCollatorWithFlattening (separator_id -100) lays it out:
    position_ids restart at each document, whose first label is -100."""
    ids = [t for d in docs for t in d]
    labels = [t if i else IGNORE_INDEX for d in docs for i, t in enumerate(d)]
    positions = [i for d in docs for i in range(len(d))]
    return {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels]),
            "position_ids": torch.tensor([positions])}


def step_micro_batches(stream) -> list[dict[str, torch.Tensor]]:
    """One optimizer step's micro-batches on this rank, as the plan packs them."""
    if PACKING == "rows":
        batches = []
        for _ in range(GRADIENT_ACCUMULATION_STEPS):
            pieces = []
            for _ in range(MICRO_BATCH_SIZE):
                room = SEQUENCE_LENGTH
                while room:  # a document that does not fit is cut
                    piece = next(stream)[:room]
                    pieces.append(piece)
                    room -= len(piece)
            batches.append(flatten(pieces))
        return batches
    groups: list[list[list[int]]] = []
    filled = MAX_TOKENS_PER_MICRO_BATCH
    for _ in range(MICRO_BATCH_SIZE * GRADIENT_ACCUMULATION_STEPS):
        doc = next(stream)
        if filled + len(doc) > MAX_TOKENS_PER_MICRO_BATCH:
            groups.append([])
            filled = 0
        groups[-1].append(doc)
        filled += len(doc)
    return [flatten(g) for g in groups]


class ToyPackedModel(nn.Module):
    """A running mean over earlier positions of the same document: nothing crosses documents."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding, self.layer, self.head = nn.Embedding(16, 8), nn.Linear(8, 8), nn.Linear(8, 16)

    def forward(self, input_ids, position_ids):
        x = self.embedding(input_ids)
        where = torch.arange(x.shape[1], device=x.device).expand_as(position_ids)
        running = x.cumsum(1)
        before = (where - position_ids - 1).clamp(min=0).unsqueeze(-1).expand_as(running)
        prior = running.gather(1, before) * (position_ids < where).unsqueeze(-1)
        return self.head(torch.tanh(self.layer((running - prior) / (position_ids + 1).unsqueeze(-1))))


def build_model() -> nn.Module:
    if TOY:
        return ToyPackedModel()
    # A Hugging Face model: attention stays within documents from position_ids only with
    # use_cache=False under sdpa/eager (flash attention takes cu_seq_lens instead).
    raise NotImplementedError("build_model(): return your model taking position_ids (or set BATCHPLAN_TOY=1)")


def loss_sum(model, batch) -> torch.Tensor:
    """The summed cross-entropy over the row's targets (shifted as a causal model shifts)."""
    logits = model(batch["input_ids"], position_ids=batch["position_ids"])
    return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(),
                                       ignore_index=IGNORE_INDEX, reduction="sum")


def build_optimizer(params) -> torch.optim.Optimizer:
    return __OPTIMIZER_CALL__


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=TRAIN_STEPS or 0)
    parser.add_argument("--log-every", type=int, default=100)
    args = parser.parse_args()
    backend = "nccl" if torch.cuda.is_available() and not TOY else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    torch.manual_seed(SEED)  # DDP also broadcasts rank 0's weights at construction
    net = build_model().to(device)
    model = DDP(net, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = build_optimizer(net.parameters())
    scheduler = __SCHEDULER__
    stream = documents(rank, world)
    step = 0
    while not args.max_steps or step < args.max_steps:
        batches = [{k: t.to(device) for k, t in b.items()} for b in step_micro_batches(stream)]
        # N before the first backward: every micro-batch's loss is scaled by it.
        counts = torch.tensor([sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches), 0.0],
                              device=device, dtype=torch.float64)
        dist.all_reduce(counts[:1])
        targets = counts[0].item()
        optimizer.zero_grad(set_to_none=True)
        for i, batch in enumerate(batches):
            # Only the rank's last micro-batch all-reduces; the others accumulate locally.
            with contextlib.nullcontext() if i == len(batches) - 1 else model.no_sync():
                loss = loss_sum(model, batch)
                (loss * (world / targets)).backward()  # DDP's mean over ranks undoes the world
            counts[1] += loss.item()
        optimizer.step()
        scheduler.step()
        step += 1
        dist.all_reduce(counts[1:])  # for the log: the step's mean loss over its targets
        print(f"rank {rank}/{world}: step {step} micro-batches {len(batches)}", flush=True)
        if rank == 0 and (step == 1 or step % args.log_every == 0):
            print(f"step {step} loss {counts[1].item() / targets:.6g} targets {int(targets)}", flush=True)
    if rank == 0:
        print(f"done: {step} optimizer steps", flush=True)
    del model, net, optimizer, scheduler
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def export_packed_python(x: ExportInput) -> Export:
    """The packed loop for a plan whose replicas all run the same micro-batch size."""
    p, packing = x.plan, x.request.packing
    assert packing is not None and x.request.sequence_length is not None  # check_packing
    require_data_parallel(x, "the packed python skeleton (plain DDP)")
    if len({g.micro_batch_size for g in p.replica_groups}) != 1:
        raise InvalidValue(
            "the packed python export runs one micro-batch size on every rank; plan an even split",
            pointer="/packing",
        )
    lr, _ = recipe(x)
    fields = {
        "__SUMMARY__": "\n".join(summary(x)).replace('"""', "'''").replace("\\", "\\\\"),
        "__NPROC__": str(p.data_parallel_size),
        "__WORLD__": str(p.data_parallel_size),
        "__ACCUM__": str(p.gradient_accumulation_steps),
        "__MICRO__": str(p.replica_groups[0].micro_batch_size),
        "__SEQ__": str(x.request.sequence_length),
        "__PACKING__": py_literal(str(packing.mode)),
        "__BUDGET__": py_literal(packing.max_tokens_per_micro_batch),
        "__LONGEST__": str(longest_document(packing, x.request.sequence_length)),
        "__TRAIN_STEPS__": py_literal(lr.train_steps),
        "__SEED__": py_literal(p.sampler.seed if p.sampler else 0),
        "__LR__": py_literal(lr.lr),
        "__LR_FUNCTION__": lr_block(x),
        "__OPTIMIZER_CALL__": optimizer_call(x, "params"),
        "__SCHEDULER__": scheduler_call(x, "optimizer"),
    }
    text = _SKELETON
    for token, value in fields.items():
        text = text.replace(token, value)
    return Export("python", "text/plain", "train.py", text)
