"""The python export of a stream plan, run for real: one torchrun of 2 gloo processes trains three
plans in turn (the splitters hf_datasets, rank_worker and webdataset; the policies cycle, pad and
drop; uneven shards, DataLoader workers, a shuffled shard order) for two epochs each, and every
rank's micro-batches of every epoch are the sample ids the plan predicts (app.core.split.stream.ids,
held to the libraries by test_stream_split)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.core.exports.parts.export_types import ExportInput, ExportUnsupported
from app.core.exports.registry import EXPORTERS, export
from app.core.planner import plan
from app.core.records.plan import Plan
from app.core.records.plan_request import PlanRequest
from app.core.split.stream.ids import trained_micro_batches
from app.schemas.plan_requests import PlanRequestIn

BASE: dict[str, Any] = {
    "topology": {"num_nodes": 1, "gpus_per_node": 2},
    "global_batch_size": 8,
    "micro_batch_size": 2,
    "learning_rate": {"base_lr": 0.05, "base_batch_size": 8},
}
STREAM = {"kind": "stream", "shuffle": True, "epochs": 2}
DATASETS: dict[str, dict[str, Any]] = {
    # 4 shards over 2 ranks: split_dataset_by_node's shards branch, its workers splitting again
    "hf_datasets": {
        **STREAM,
        "num_shards": 4,
        "shard_samples": [7, 3, 5, 2],
        "splitter": "hf_datasets",
        "num_workers": 2,
        "seed": 3,
        "end_of_epoch": "cycle",
    },
    "rank_worker": {
        **STREAM,
        "num_shards": 5,
        "num_samples": 23,
        "splitter": "rank_worker",
        "seed": 1,
        "end_of_epoch": "pad",
    },
    "webdataset": {
        **STREAM,
        "num_shards": 6,
        "shard_samples": [4, 1, 6, 2, 5, 3],
        "splitter": "webdataset",
        "num_workers": 2,
        "seed": 2,
        "end_of_epoch": "drop",
    },
}
# Runs each skeleton's main() in the same ranks: one torchrun imports torch and datasets once. The
# process group is started once (a group started again on torchrun's store may read the last
# one's addresses), so the skeletons' own start and end of it are skipped.
DRIVER = """
import runpy, sys
import torch.distributed as dist
dist.init_process_group("gloo")
destroy = dist.destroy_process_group
dist.init_process_group = dist.destroy_process_group = lambda *args, **kwargs: None
for name in sys.argv[1:]:
    sys.argv = [name, "--log-every", "100"]
    runpy.run_path(name, run_name="__main__")
destroy()
"""


def _planned(dataset: dict[str, Any]) -> tuple[PlanRequest, Plan]:
    request = PlanRequestIn.model_validate({**BASE, "dataset": dataset}).to_core()
    return request, plan(request)


def _run(scripts: list[Path], tmp_path: Path) -> str:
    # A package named `app` that refuses to load comes first on the path: the skeleton is a file
    # users copy, and must run without this project.
    shadow = tmp_path / "shadow" / "app"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('the skeleton imported app')\n")
    (tmp_path / "drive.py").write_text(DRIVER)
    env = {**os.environ, "BATCHPLAN_TOY": "1", "PYTHONPATH": str(shadow.parent), "OMP_NUM_THREADS": "1"}
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.Popen(
        [*run, str(tmp_path / "drive.py"), *map(str, scripts)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        start_new_session=True,  # its own process group: a hang is killed whole
    )
    try:
        return proc.communicate(timeout=180)[0]
    except subprocess.TimeoutExpired:
        # A hang: torchrun ends its ranks (each in a session of its own) on SIGTERM.
        proc.send_signal(signal.SIGTERM)
        try:
            return "TIMED OUT after 180 s\n" + proc.communicate(timeout=30)[0]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
def test_each_rank_trains_the_plans_samples_every_epoch(tmp_path: Path) -> None:
    # Found, not imported: importing datasets here would cost this process seconds of CPU.
    for package in ("datasets", "webdataset"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed")
    planned = {name: _planned(dataset) for name, dataset in DATASETS.items()}
    scripts = []
    for name, (request, p) in planned.items():
        scripts.append(tmp_path / f"train_{name}.py")  # not webdataset.py: the package
        scripts[-1].write_text(export("python", ExportInput(request, p)).text)
    out = _run(scripts, tmp_path)
    runs = out.split("PLACEHOLDERS in use")[1:]
    assert len(runs) == 3 and out.count("done: 6 optimizer steps") == 3, out
    # The ranks' lines may interleave: the ids' list is matched to its last bracket.
    ids = r"(\[(?:\[[\d, ]*\](?:, )?)*\])"
    line = re.compile(r"rank (\d)/2 epoch (\d): trained (\d+) micro-batches, (\d+) samples ids " + ids)
    for (name, (request, p)), text in zip(planned.items(), runs, strict=True):
        assert request.dataset is not None and request.dataset.stream is not None and p.stream is not None
        stream = p.stream
        seen = {(int(m[1]), int(m[2])): (int(m[3]), int(m[4]), json.loads(m[5])) for m in line.finditer(text)}
        assert len(seen) == 4, (name, text)
        for epoch in (0, 1):
            want = trained_micro_batches(
                request.dataset.stream, 2, (2, 2), p.gradient_accumulation_steps, epoch
            )
            for rank in (0, 1):
                count, samples, ids = seen[rank, epoch]
                assert [tuple(m) for m in ids] == list(want[rank]), (name, epoch, rank)
                assert samples == sum(len(m) for m in want[rank])
                # The plan's figures for epoch 0's order: every rank the same count, the policy's
                assert epoch or count == stream.micro_batches_per_epoch - stream.leftover_micro_batches


def test_the_sampler_exports_refuse_a_stream() -> None:
    """Those that write a sampler's loader refuse, naming the exports that can (torchtitan's
    refusals of policies other than steps: test_exports_language_models; hf-trainer's and
    accelerate's of policies other than drop: test_exports_hf_trainer_stream)."""
    request, p = _planned(DATASETS["hf_datasets"])
    for fmt in EXPORTERS:
        if fmt == "python":
            assert (
                "split_dataset_by_node(ds, rank=rank, world_size=world)"
                in export(fmt, ExportInput(request, p)).text
            )
            continue
        if fmt in ("torchtitan", "hf-trainer", "accelerate"):
            continue
        with pytest.raises(ExportUnsupported, match="python export builds the stream") as err:
            export(fmt, ExportInput(request, p))
        assert getattr(err.value, "pointer", None) == "/dataset/kind"
