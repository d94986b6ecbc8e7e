"""The language-model exports loaded by the real packages: the torchtitan TOML by torchtitan's
own ConfigManager (torchtitan 0.2.2), its degrees by torchtitan's ParallelDims, and the
megatron arguments fed to megatron-core's own micro-batch calculators (constant and ramp-up),
whose numbers must be the plan's."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from export_helpers import export_input
from megatron_calculator import calculator_module

from app.core.errors.domain import PlanError
from app.core.exports.parts.export_types import ExportInput, ExportOptions, ExportUnsupported
from app.core.exports.registry import export
from app.schemas.examples import plan_example

pytestmark = pytest.mark.slow  # torchtitan's loader runs in a process that imports torch

LANGUAGE_MODEL = plan_example("language_model")
SAMPLES_WITH_SEQUENCES = {
    "topology": {"num_nodes": 2, "gpus_per_node": 8},
    "parallelism": {"tensor": 2, "pipeline": 2, "context": 2},
    "sequence_length": 2048,
    "global_batch_size": 256,
    "micro_batch_size": 4,
    # From lr / (warmup + 1): torchtitan's warmup (its export refuses any other start).
    "learning_rate": {
        "base_lr": 0.0003,
        "optimizer": "adam",
        "warmup_steps": 20,
        "warmup_start_lr": 0.0003 / 21,
    },
}
# HSDP: 8 data-parallel ranks as 2 replicas of 4-way shards (issue 17's data_parallel_shard).
HSDP = {
    **SAMPLES_WITH_SEQUENCES,
    "topology": {"num_nodes": 4, "gpus_per_node": 8},
    "parallelism": {"tensor": 2, "pipeline": 2, "data_parallel_shard": 4},
}
BODIES = {"language_model": LANGUAGE_MODEL, "samples_with_sequences": SAMPLES_WITH_SEQUENCES, "hsdp": HSDP}


def _with_options(body: dict[str, Any], options: ExportOptions) -> ExportInput:
    x = export_input(body)
    return ExportInput(x.request, x.plan, options)


# ----------------------------------------------------------------------------- torchtitan


TORCHTITAN = importlib.util.find_spec("torchtitan") is not None
LOADER = Path(__file__).with_name("torchtitan_loader.py")


def _torchtitan_reads(x: ExportInput, tmp_path: Path) -> dict[str, Any]:
    """The torchtitan export of `x` as torchtitan's own config loader reads it (LOADER, in a
    process of its own): the fields it prints."""
    path = tmp_path / "batchplan.toml"
    path.write_text(export("torchtitan", x).text)
    completed = subprocess.run(
        [sys.executable, str(LOADER), str(path), str(x.plan.world_size)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return dict(json.loads(completed.stdout.splitlines()[-1]))


@pytest.mark.skipif(not TORCHTITAN, reason="torchtitan is not installed (consumers group)")
@pytest.mark.parametrize("name", list(BODIES))
def test_torchtitans_config_loader_reads_the_plan(name: str, tmp_path: Path) -> None:
    x = export_input(BODIES[name])
    t = _torchtitan_reads(x, tmp_path)
    assert "site-packages/torchtitan/config/manager.py" in t["torchtitan_file"]
    p, seq = x.plan, x.request.sequence_length
    assert (t["local_batch_size"], t["global_batch_size"], t["seq_len"]) == (
        p.micro_batch_size,
        p.global_batch_size,
        seq,
    )
    # torchtitan's Trainer: global % (local x batch degree) == 0, accumulation = the quotient.
    local, batch_degree = t["local_batch_size"], t["batch_degree"]
    assert batch_degree == p.data_parallel_size
    mesh = p.device_mesh
    assert mesh is not None
    assert (t["dp_replicate"], t["dp_shard"]) == (mesh.data_parallel_replicate, mesh.data_parallel_shard)
    assert t["global_batch_size"] % (local * batch_degree) == 0
    assert t["global_batch_size"] // (local * batch_degree) == p.gradient_accumulation_steps
    assert p.tokens is not None and local * t["seq_len"] == p.tokens.tokens_per_micro_batch
    lr = p.learning_rate
    assert lr is not None
    # torchtitan's warmup reaches the lr at its step warmup_steps - 1: one more than the plan's.
    assert t["optimizer"]["lr"] == lr.lr and t["lr_scheduler"] == {
        "warmup_steps": lr.warmup_steps + 1,
        "decay_ratio": 0.0,
    }
    assert t["optimizer"]["name"] in ("Adam", "AdamW") and t["optimizer"]["weight_decay"] == 0.0


STREAM = {
    "topology": {"num_nodes": 1, "gpus_per_node": 8},
    "global_batch_size": 64,
    "micro_batch_size": 4,
    "sequence_length": 2048,
    "dataset": {
        "kind": "stream",
        "num_shards": 64,
        "num_samples": 100000,
        "splitter": "hf_datasets",
        "num_workers": 2,
        "end_of_epoch": "steps",
    },
    "learning_rate": {"base_lr": 0.0003, "optimizer": "adamw", "train_steps": 1000},
}


@pytest.mark.skipif(not TORCHTITAN, reason="torchtitan is not installed (consumers group)")
def test_torchtitan_runs_a_stream_as_steps(tmp_path: Path) -> None:
    """A stream: torchtitan's loader repeats it (no key: infinite=True) for training.steps steps,
    read by the plan's DataLoader workers; the policies it cannot follow are refused."""
    x = export_input(STREAM)
    t = _torchtitan_reads(x, tmp_path)
    assert (t["steps"], t["num_workers"], t["local_batch_size"]) == (1000, 2, 4)
    assert "the stream repeats" in export("torchtitan", x).text
    for changed, pointer, valid in (
        ("end_of_epoch", "/dataset/end_of_epoch", "steps"),
        ("splitter", "/dataset/splitter", "hf_datasets"),
    ):
        body = {
            **STREAM,
            "dataset": {**STREAM["dataset"], changed: "drop" if changed == "end_of_epoch" else "webdataset"},
        }
        with pytest.raises(ExportUnsupported) as err:
            export("torchtitan", export_input(body))
        assert err.value.pointer == pointer and f'{changed} "{valid}"' in err.value.detail


def test_torchtitan_refuses_an_uneven_plan() -> None:
    with pytest.raises(ExportUnsupported, match="torchtitan"):
        export("torchtitan", export_input(plan_example("mixed")))


# ----------------------------------------------------------------------------- megatron

MEGATRON = calculator_module()
needs_megatron = pytest.mark.skipif(
    MEGATRON is None, reason="megatron-core is not installed (consumers group)"
)


def _megatron_args(x: ExportInput) -> dict[str, list[str]]:
    """The exported bash array as Megatron's argparse sees it: each flag with its values."""
    text = export("megatron", x).text
    words = subprocess.run(
        ["bash", "-c", text + '\nprintf "%s\\n" "${MEGATRON_ARGS[@]}"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")[:-1]
    args: dict[str, list[str]] = {}
    for word in words:
        if word.startswith("--"):
            args[word] = []
            flag = word
        else:
            args[flag].append(word)
    return args


def _calculator(args: dict[str, list[str]], world: int) -> Any:
    """megatron-core's calculator as Megatron's training setup builds it from these args."""
    assert MEGATRON is not None
    model_parallel = 1
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size"):
        model_parallel *= int(args[flag][0])
    ramp = args.get("--rampup-batch-size")
    return MEGATRON._build_num_microbatches_calculator(
        1,  # not rank 0: no logging
        [int(v) for v in ramp] if ramp else None,
        int(args["--global-batch-size"][0]),
        int(args["--micro-batch-size"][0]),
        world // model_parallel,
        False,
    )


@needs_megatron
@pytest.mark.parametrize("name", list(BODIES))
def test_megatrons_calculator_runs_the_plans_micro_batches(name: str) -> None:
    x = export_input(BODIES[name])
    args = _megatron_args(x)
    calc = _calculator(args, x.plan.world_size)
    calc.update(0, True)  # consistency_check: Megatron asserts the batch splits into micro-batches
    assert calc.get() == x.plan.gradient_accumulation_steps
    assert calc.get_current_global_batch_size() == x.plan.global_batch_size
    assert args["--seq-length"] == [str(x.request.sequence_length)]
    lr = x.plan.learning_rate
    assert lr is not None and float(args["--lr"][0]) == lr.lr
    assert args["--lr-warmup-iters"] == [str(lr.warmup_steps)]
    assert ("--calculate-per-token-loss" in args) == (x.request.loss_normalization.value == "token")


@needs_megatron
def test_a_ramp_is_written_in_samples_as_megatron_counts_them() -> None:
    body = {**SAMPLES_WITH_SEQUENCES, "dataset": {"num_samples": 100_000, "epochs": 2}}
    x = _with_options(body, ExportOptions(rampup=(64, 64, 20_000)))
    args = _megatron_args(x)
    assert args["--rampup-batch-size"] == ["64", "64", "20000"] and "--train-iters" not in args
    calc = _calculator(args, x.plan.world_size)
    # Replay Megatron's loop: the samples consumed by the plan's warmup steps and by the run.
    lr = x.plan.learning_rate
    assert lr is not None and x.plan.sampler is not None
    consumed, by_step = 0, []
    for _ in range(x.plan.sampler.total_optimizer_steps or 0):
        calc.update(consumed, True)
        by_step.append(consumed)
        consumed += calc.get_current_global_batch_size()
    assert args["--lr-warmup-samples"] == [str(by_step[lr.warmup_steps])]
    assert args["--train-samples"] == [str(consumed)]


def test_a_ramp_that_does_not_split_into_micro_batches_is_refused() -> None:
    x = _with_options(SAMPLES_WITH_SEQUENCES, ExportOptions(rampup=(60, 64, 20_000)))
    with pytest.raises(PlanError) as caught:
        export("megatron", x)
    assert caught.value.pointer == "/rampup_batch_size"
    unit = x.plan.global_batch_size // x.plan.gradient_accumulation_steps
    assert f"is not a multiple of micro-batch x data-parallel size = {unit}" in caught.value.detail
    # The ramp is one query string (START,INCREMENT,SAMPLES): no suggestion names a whole-number
    # field of this request, so none is given; the multiple the detail names does export.
    assert caught.value.suggestions == {}
    export(
        "megatron",
        _with_options(SAMPLES_WITH_SEQUENCES, ExportOptions(rampup=((60 // unit + 1) * unit, 64, 20_000))),
    )
