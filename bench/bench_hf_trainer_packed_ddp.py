"""The hf-trainer export of packed rows, trained by transformers' real Trainer in 2 processes
under torchrun (gloo, CPU, a tiny random Llama, 2 epochs of 3 optimizer steps): the
`num_items_in_batch` each process's Trainer computes at every micro-batch is the step's
valid-target count as the plan counts it, summed over both processes' rows as the plan's
sampler deals them (a row of sequence_length positions holding d documents has
sequence_length - d targets).

A script, not a test: two processes that each import transformers cost well over the suite's
15 CPU-s for one test (tests/core/test_exports_hf_trainer_packed.py runs the same in one
process). Prints the counts, PASS/MISS, and the run's CPU time; exits 0.

    .venv/bin/python bench/bench_hf_trainer_packed_ddp.py
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.core.exports.parts.export_types import ExportInput
from app.core.exports.registry import export
from app.core.planner import plan
from app.schemas.plan_requests import PlanRequestIn

SEQ, EPOCHS, STEPS_PER_EPOCH = 16, 2, 3
ROWS: dict[str, Any] = {
    "topology": {"num_nodes": 1, "gpus_per_node": 2},
    "global_batch_size": 8,
    "micro_batch_size": 2,
    "sequence_length": SEQ,
    "loss_normalization": "token",
    "packing": {"mode": "rows", "document_length": {"max": 7}},
    "learning_rate": {"base_lr": 0.05, "base_batch_size": 8},
}

# Each process: the exported module, a Trainer that records num_items_in_batch, 2 epochs.
WORKER = """
import json, os, sys
import torch, transformers
sys.path.insert(0, os.path.dirname(__file__))
import training_args as exported

rank = int(os.environ["RANK"])
documents = json.load(open(sys.argv[1]))
args = exported.training_args
args.output_dir, args.save_strategy, args.num_train_epochs = sys.argv[2], "no", {epochs}
args.report_to = []
assert args.world_size == 2, f"the Trainer sees {{args.world_size}} processes"
rows = exported.pack_rows(documents)
seen = []

class Recording(exported.PlanTrainer):
    def compute_loss(self, model, inputs, **kwargs):
        seen.append(float(kwargs["num_items_in_batch"]))
        return super().compute_loss(model, inputs, **kwargs)

torch.set_num_threads(1)
config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
torch.manual_seed(0)
Recording(model=transformers.LlamaForCausalLM(config), args=args, train_dataset=rows).train()
json.dump(seen, open(os.path.join(sys.argv[2], f"seen{{rank}}.json"), "w"))
if rank == 0:
    json.dump(rows, open(os.path.join(sys.argv[2], "rows.json"), "w"))
"""


def _documents(total: int) -> list[list[int]]:
    """Seeded documents of 2 to 7 tokens, `total` tokens in all (the last one cut to fit)."""
    generator, docs, left = random.Random(7), [], total
    while left:
        length = min(generator.randint(2, 7), left)
        docs.append([generator.randint(1, 31) for _ in range(length)])
        left -= length
    return docs


def _expected(rows: list[list[list[int]]], accumulation: int, micro: int, world: int) -> list[int]:
    """Every step's N: the rows the plan's DistributedSampler deals each process, epoch by epoch."""
    import torch

    counts = []
    for epoch in range(EPOCHS):
        orders = []
        for rank in range(world):
            sampler = torch.utils.data.DistributedSampler(
                rows, num_replicas=world, rank=rank, shuffle=True, seed=0
            )
            sampler.set_epoch(epoch)
            orders.append(list(sampler))
        per_step = micro * accumulation
        for k in range(len(orders[0]) // per_step):
            counts.append(
                sum(SEQ - len(rows[i]) for o in orders for i in o[k * per_step : (k + 1) * per_step])
            )
    return counts


def main() -> None:
    request = PlanRequestIn.model_validate(ROWS).to_core()
    planned = plan(request)
    g, micro, world = planned.gradient_accumulation_steps, ROWS["micro_batch_size"], 2
    text = export("hf-trainer", ExportInput(request, planned)).text
    documents = _documents(STEPS_PER_EPOCH * ROWS["global_batch_size"] * SEQ)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "training_args.py").write_text(text)
        (folder / "worker.py").write_text(WORKER.format(epochs=EPOCHS))
        (folder / "documents.json").write_text(json.dumps(documents))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(world),
        ]
        done = subprocess.run(
            [*command, str(folder / "worker.py"), str(folder / "documents.json"), str(folder)],
            capture_output=True,
            text=True,
            timeout=900,
            # On CPU, TrainingArguments forms the process group (gloo) only when told to use it.
            env={**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"},
            check=False,
        )
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        if done.returncode != 0:
            print(f"MISS: torchrun exited {done.returncode}\n{done.stderr[-3000:]}")
            return
        seen = [json.loads((folder / f"seen{r}.json").read_text()) for r in range(world)]
        rows = json.loads((folder / "rows.json").read_text())
    expected = _expected(rows, g, micro, world)
    # compute_loss sees the step's count at each of its micro-batches, on every process.
    wanted = [float(n) for n in expected for _ in range(g)]
    bound = planned.tokens.max_valid_targets_per_step if planned.tokens else None
    print(f"plan: {world} processes x micro-batch {micro} rows x accumulation {g}, {EPOCHS} epochs")
    print(f"the plan's N per step: {expected} (bound {bound})")
    for rank, got in enumerate(seen):
        print(f"process {rank}: num_items_in_batch per micro-batch {got}")
    held = all(got == wanted for got in seen) and len(set(expected)) > 1
    held = held and bound is not None and max(expected) <= bound
    print(f"{'PASS' if held else 'MISS'}: num_items_in_batch is the plan's valid-target count of every step")
    print(f"torchrun's 2 processes: {wall:.1f} s wall, {cpu:.1f} CPU-s (load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
