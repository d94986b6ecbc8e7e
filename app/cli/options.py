"""The options several commands share, declared once: typer `Annotated` aliases, and the flag
groups (see flag_groups.py) that `plan`, `export` and `check` take as one parameter each."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from app.client import Json
from app.core.plan_types import Divisibility, LossReduction, LRRule, Optimizer

NODE_GROUP_HELP = (
    "A mixed cluster, one group per flag: NAME:NODES:GPUS_PER_NODE[:THROUGHPUT[:CAP]] "
    "(e.g. h100:2:8:2.0:64). Instead of --num-nodes/--gpus-per-node."
)

NumNodes = Annotated[int | None, typer.Option(help="Nodes in the cluster (default: 1).", show_default=False)]
GpusPerNode = Annotated[int | None, typer.Option(help="GPUs per node (default: 8).", show_default=False)]
NodeGroups = Annotated[
    list[str] | None, typer.Option("--node-group", help=NODE_GROUP_HELP, show_default=False)
]
GlobalBatch = Annotated[int | None, typer.Option("--global-batch-size", "-b")]
MicroBatch = Annotated[int | None, typer.Option("--micro-batch-size", "-m")]
Accumulation = Annotated[int | None, typer.Option("--accumulation", "-g")]
MaxMicro = Annotated[int | None, typer.Option(help="Micro-batch cap per GPU.")]
NumSamples = Annotated[int | None, typer.Option(help="Dataset size (adds the sampler).")]
BaseLr = Annotated[float | None, typer.Option(help="Adds the learning rate.")]
RequestFile = Annotated[
    Path | None, typer.Option(help="A JSON plan request (overrides the plan flags).", show_default=False)
]
Url = Annotated[
    str | None, typer.Option(help="A batchplan server, e.g. http://127.0.0.1:8000 (default: compute here).")
]
ApiKey = Annotated[
    str | None,
    typer.Option(envvar="BATCHPLAN_API_KEY", help="Sent as Authorization: Bearer.", show_default=False),
]
Output = Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file instead of stdout.")]


@dataclass(frozen=True)
class BatchFlags:
    """The plan flags of `plan`, `export` and `check`: topology, batch, parallelism, dataset."""

    num_nodes: NumNodes = None
    gpus_per_node: GpusPerNode = None
    node_groups: NodeGroups = None
    global_batch_size: GlobalBatch = None
    micro_batch_size: MicroBatch = None
    gradient_accumulation_steps: Accumulation = None
    max_micro_batch_size: MaxMicro = None
    divisibility: Divisibility = Divisibility.EXACT
    loss_reduction: LossReduction = LossReduction.MEAN
    tensor: int = 1
    pipeline: int = 1
    context: int = 1
    num_samples: NumSamples = None
    drop_last: bool = False
    no_shuffle: bool = False
    data_seed: Annotated[int, typer.Option("--data-seed", help="Sampler shuffle seed.")] = 0
    epochs: int | None = None


@dataclass(frozen=True)
class PlanFlags(BatchFlags):
    """`plan` and `export` add the learning rate, and `--seed` for the sampler (on `check`,
    `--seed` seeds the weights). A redeclared field keeps its place in the option list."""

    data_seed: Annotated[int, typer.Option("--seed", "--data-seed", help="Sampler shuffle seed.")] = 0
    base_lr: BaseLr = None
    base_batch_size: int = 256
    rule: LRRule = LRRule.AUTO
    optimizer: Optimizer = Optimizer.SGD
    warmup_epochs: float | None = None
    warmup_steps: int | None = None


@dataclass(frozen=True)
class ExportFlags:
    """What an export writes into its file (`export`'s wording)."""

    script: Annotated[str | None, typer.Option(help="The training script (default: train.py).")] = None
    job_name: Annotated[str | None, typer.Option(help="Slurm/PyTorchJob name (default: batchplan).")] = None
    image: Annotated[str | None, typer.Option(help="The PyTorchJob container image.")] = None
    master_port: Annotated[int | None, typer.Option(help="Rendezvous port (default: 29500).")] = None

    def query(self) -> Json:
        """The export options as the API takes them (query parameters): only those given."""
        given = {
            "script": self.script,
            "job_name": self.job_name,
            "image": self.image,
            "port": self.master_port,
        }
        return {k: v for k, v in given.items() if v is not None}


@dataclass(frozen=True)
class PlanExportFlags(ExportFlags):
    """The same options on `plan`, where only an export --format uses them."""

    script: Annotated[str | None, typer.Option(help="Exports: the training script (default: train.py).")] = (
        None
    )
    job_name: Annotated[
        str | None, typer.Option(help="Exports: Slurm/PyTorchJob name (default: batchplan).")
    ] = None
    image: Annotated[str | None, typer.Option(help="Exports: the PyTorchJob container image.")] = None
    master_port: Annotated[int | None, typer.Option(help="Exports: rendezvous port (default: 29500).")] = None
