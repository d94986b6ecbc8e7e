"""The hf-trainer and accelerate exports of a stream plan, run by transformers' own Trainer and by
the accelerate export's train() under torchrun (the same 2 gloo processes on CPU, a one-weight
model): over two epochs of a real `datasets` stream, each with its own shard order, every rank
trains exactly the micro-batches of sample ids the plan predicts (app.core.split.stream.ids, held
to the libraries by test_stream_split). Two plans in the same processes: split_dataset_by_node's
shards branch and its examples branch (shards that do not divide over the ranks), each with
DataLoader workers and a shuffled shard order. A plain Trainer would read the stream on rank 0
alone or split it twice; PlanTrainer and train() split it once."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from itertools import accumulate
from pathlib import Path
from typing import Any

import pytest

from app.core.exports.accelerate import CODE_END, CODE_START
from app.core.exports.parts.export_types import ExportInput, ExportUnsupported
from app.core.exports.registry import export
from app.core.planner import plan
from app.core.records.plan_request import PlanRequest
from app.core.split.stream.ids import trained_micro_batches
from app.schemas.plan_requests import PlanRequestIn

BASE: dict[str, Any] = {
    "topology": {"num_nodes": 1, "gpus_per_node": 2},
    "global_batch_size": 8,
    "micro_batch_size": 2,
    "learning_rate": {"base_lr": 0.05, "base_batch_size": 8},
}
STREAMS: dict[str, dict[str, Any]] = {
    # 8 shards over 2 ranks: whole shards, each rank's split again over its 2 workers
    "shards": {
        "kind": "stream",
        "num_shards": 8,
        "shard_samples": [7, 3, 5, 2, 4, 1, 6, 2],
        "splitter": "hf_datasets",
        "num_workers": 2,
        "shuffle": True,
        "seed": 3,
        "end_of_epoch": "drop",
        "epochs": 2,
    },
    # 5 shards over 2 ranks: every rank reads all, keeping 1 sample in 2, over its 2 workers
    "examples": {
        "kind": "stream",
        "num_shards": 5,
        "num_samples": 19,
        "splitter": "hf_datasets",
        "num_workers": 2,
        "shuffle": True,
        "seed": 1,
        "end_of_epoch": "drop",
        "epochs": 2,
    },
}
# Each process trains every exported plan in turn; its model records the ids it is handed.
WORKER = """
import json, os, sys, importlib.util
import datasets, torch
from torch import nn

rank = int(os.environ["RANK"])
torch.set_num_threads(1)
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location("training_args", path)
    exported = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exported)
    args = exported.training_args
    args.output_dir, args.save_strategy, args.report_to = os.path.dirname(path), "no", []
    shards = json.load(open(path + ".shards.json"))
    def generate(shards):
        for shard in shards:
            for i in shard:
                yield {"input_ids": i}
    features = datasets.Features({"input_ids": datasets.Value("int64")})
    stream = datasets.IterableDataset.from_generator(
        generate, features=features, gen_kwargs={"shards": shards}
    )
    seen = []
    class OneWeight(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Linear(1, 1)
        def forward(self, input_ids, labels):
            seen.append(input_ids.tolist())
            return {"loss": ((self.w(labels[:, None]) - labels[:, None]) ** 2).mean()}
    def collate(examples):
        ids = torch.tensor([e["input_ids"] for e in examples])
        return {"input_ids": ids, "labels": ids.float()}
    torch.manual_seed(0)
    trainer = exported.PlanTrainer(model=OneWeight(), args=args, train_dataset=stream, data_collator=collate)
    trainer.train()
    # The accelerate export's train(), in the same processes (its Accelerator shares the state).
    exported = {}
    exec(open(path.replace("training_args.py", "accelerate_train.py")).read(), exported)
    read = []
    class Recorded(nn.Linear):
        def forward(self, input_ids):
            read.append(input_ids.tolist())
            return super().forward(input_ids[:, None].float())
    def loss_fn(output, targets):
        return ((output - targets[:, None]) ** 2).mean()
    def pairs(examples):
        ids = torch.tensor([e["input_ids"] for e in examples])
        return ids, ids.float()
    torch.manual_seed(0)
    exported["train"](Recorded(1, 1), stream, loss_fn, pairs)
    done = {"ids": seen, "steps": trainer.state.global_step, "accelerate": read}
    json.dump(done, open(f"{path}.rank{rank}.json", "w"))
"""


def _planned(dataset: dict[str, Any]) -> tuple[PlanRequest, Any]:
    request = PlanRequestIn.model_validate({**BASE, "dataset": dataset}).to_core()
    return request, plan(request)


def _accelerate_script(request: PlanRequest, p: Any) -> str:
    """The training script in the accelerate export's header, uncommented."""
    lines = export("accelerate", ExportInput(request, p)).text.splitlines()
    start, end = lines.index(f"# {CODE_START}"), lines.index(f"# {CODE_END}")
    return "\n".join(line[2:] if line.startswith("# ") else "" for line in lines[start + 1 : end]) + "\n"


def _shards(sizes: list[int]) -> list[list[int]]:
    return [list(range(a, a + n)) for a, n in zip(accumulate(sizes, initial=0), sizes, strict=False)]


@pytest.mark.slow  # two processes import transformers and datasets: about 40 CPU-s in all
def test_each_rank_trains_the_plans_samples_in_the_real_trainer(tmp_path: Path) -> None:
    for package in ("datasets", "transformers", "accelerate"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed")
    paths, planned = [], {}
    for name, dataset in STREAMS.items():
        request, p = _planned(dataset)
        assert request.dataset is not None and request.dataset.stream is not None and p.stream is not None
        planned[name] = (request, p)
        path = tmp_path / name / "training_args.py"
        path.parent.mkdir()
        path.write_text(export("hf-trainer", ExportInput(request, p)).text)
        path.with_name("accelerate_train.py").write_text(_accelerate_script(request, p))
        spec = request.dataset.stream
        q, m = divmod(p.stream.num_samples, spec.num_shards)
        sizes = list(spec.shard_samples or [q + 1] * m + [q] * (spec.num_shards - m))
        Path(f"{path}.shards.json").write_text(json.dumps(_shards(sizes)))
        paths.append(path)
    assert [p.stream.branch for _, p in planned.values()] == ["shards", "examples"]
    (tmp_path / "worker.py").write_text(WORKER)
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    done = subprocess.run(
        [*run, str(tmp_path / "worker.py"), *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=300,
        # On CPU, TrainingArguments forms the process group (gloo) only when told to use it.
        env={**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"},
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for path, (name, (request, p)) in zip(paths, planned.items(), strict=True):
        assert request.dataset is not None and request.dataset.stream is not None
        per_epoch = [
            trained_micro_batches(request.dataset.stream, 2, (2, 2), p.gradient_accumulation_steps, epoch)
            for epoch in (0, 1)
        ]
        steps = sum(len(epoch[0]) for epoch in per_epoch) // p.gradient_accumulation_steps
        for rank in (0, 1):
            got = json.loads(Path(f"{path}.rank{rank}.json").read_text())
            want = [list(m) for epoch in per_epoch for m in epoch[rank]]
            assert got["ids"] == want, (name, rank)
            assert got["accelerate"] == want, (name, rank)
            assert got["steps"] == steps
        # Each epoch has its own shard order: PlanStream.set_epoch reached datasets.
        assert per_epoch[0] != per_epoch[1], name


@pytest.mark.parametrize(
    ("change", "field", "valid"),
    [
        ({"end_of_epoch": "cycle"}, "end_of_epoch", "drop"),
        ({"splitter": "rank_worker"}, "splitter", "hf_datasets"),
    ],
)
def test_what_the_trainer_cannot_run_is_refused(change: dict[str, str], field: str, valid: str) -> None:
    request, p = _planned({**STREAMS["shards"], **change})
    for fmt in ("hf-trainer", "accelerate"):
        with pytest.raises(ExportUnsupported) as err:
            export(fmt, ExportInput(request, p))
        assert err.value.pointer == f"/dataset/{field}"
        # suggestions hold numbers: the nearest valid value is named in the detail
        assert f'plan {field} "{valid}"' in err.value.detail
