"""The options several commands share, declared once: typer `Annotated` aliases, and the flag
groups (see flag_groups.py) that `plan`, `export` and `check` take as one parameter each.

Every option has help and a group for `--help` (help_panels.py; tests/cli/test_help_and_flags.py
and test_help_groups.py hold that). Two seeds, two names, the same in every command: `--data-seed`
is the sampler's shuffle seed (the request's `dataset.seed`); `--seed`, on `check` only,
is the check's own seed (weights and synthetic samples).

Over 300 lines: one concept, the declarations of the shared flags (each a few lines of help and
its group); split, a flag's declaration would be looked for in two places.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from app.cli.help_panels import BATCH, CLUSTER, DATA, LEARNING_RATE, OUTPUT
from app.cli.stream_flags import EndOfEpoch, NumShards, NumWorkers, ShardSamples, Splitter, StreamFlag
from app.client import Json
from app.core.records.plan_request import (
    Decay,
    Divisibility,
    LossNormalization,
    LossReduction,
    LRRule,
    Optimizer,
)

NODE_GROUP_HELP = (
    "A mixed cluster, one group per flag: NAME:NODES:GPUS_PER_NODE[:THROUGHPUT[:CAP]] "
    "(e.g. h100:2:8:2.0:64). Replaces --num-nodes and --gpus-per-node."
)
CURVE_HELP = (
    "A measured throughput curve, MICRO:SAMPLES_PER_S pairs (e.g. 8:960,16:1840,32:2600); with "
    "--node-group, one flag per group: NAME=8:960,16:1840. The split and the accumulation are then "
    "planned from the curves (docs/throughput-curves.md)."
)
DIVISIBILITY_HELP = (
    "When the numbers do not divide: exact refuses (with suggestions), round_down/round_up move "
    "the global batch, balance gives replicas different micro-batches."
)

NumNodes = Annotated[
    int | None, typer.Option(help="Nodes in the cluster (default: 1).", rich_help_panel=CLUSTER)
]
GpusPerNode = Annotated[int | None, typer.Option(help="GPUs per node (default: 8).", rich_help_panel=CLUSTER)]
NodeGroups = Annotated[
    list[str] | None,
    typer.Option("--node-group", metavar="GROUP", help=NODE_GROUP_HELP, rich_help_panel=CLUSTER),
]
ThroughputCurves = Annotated[
    list[str] | None,
    typer.Option(
        "--throughput-curve", metavar="[GROUP=]MICRO:RATE,...", help=CURVE_HELP, rich_help_panel=CLUSTER
    ),
]
GlobalBatch = Annotated[
    int | None,
    typer.Option(
        "--global-batch-size",
        "-b",
        help="Samples per optimizer step, all replicas together.",
        rich_help_panel=BATCH,
    ),
]
MicroBatch = Annotated[
    int | None,
    typer.Option(
        "--micro-batch-size", "-m", help="Samples per GPU per forward/backward.", rich_help_panel=BATCH
    ),
]
Accumulation = Annotated[
    int | None,
    typer.Option(
        "--accumulation",
        "-g",
        help="Gradient accumulation steps (micro-batches per step).",
        rich_help_panel=BATCH,
    ),
]
MaxMicro = Annotated[int | None, typer.Option(help="Micro-batch cap per GPU.", rich_help_panel=BATCH)]
Div = Annotated[Divisibility, typer.Option(help=DIVISIBILITY_HELP, rich_help_panel=BATCH)]
Reduction = Annotated[
    LossReduction,
    typer.Option(
        help="How the training loss reduces a micro-batch (sets loss scales).", rich_help_panel=BATCH
    ),
]
Tensor = Annotated[int, typer.Option(help="Tensor-parallel size.", rich_help_panel=CLUSTER)]
Pipeline = Annotated[int, typer.Option(help="Pipeline-parallel size.", rich_help_panel=CLUSTER)]
Context = Annotated[int, typer.Option(help="Context-parallel size.", rich_help_panel=CLUSTER)]
DataParallelShard = Annotated[
    int,
    typer.Option(
        help="FSDP shard group: 1 DDP, the data-parallel size FSDP, a divisor HSDP.", rich_help_panel=CLUSTER
    ),
]
Expert = Annotated[
    int,
    typer.Option(help="Expert-parallel size (borrows ranks; torchtitan's rules).", rich_help_panel=CLUSTER),
]
SequenceLength = Annotated[
    int | None,
    typer.Option(
        help="Tokens per sample: the plan reports tokens and takes the batch in them.", rich_help_panel=BATCH
    ),
]
GlobalBatchTokens = Annotated[
    int | None,
    typer.Option(help="Tokens per optimizer step, instead of --global-batch-size.", rich_help_panel=BATCH),
]
MicroBatchTokens = Annotated[
    int | None,
    typer.Option(
        help="Tokens per micro-batch per data-parallel rank, instead of --micro-batch-size.",
        rich_help_panel=BATCH,
    ),
]
Normalization = Annotated[
    LossNormalization,
    typer.Option(
        help="sample: each sample weighs the same; token: each valid token of the step does.",
        rich_help_panel=BATCH,
    ),
]
BaseBatchTokens = Annotated[
    int | None,
    typer.Option(
        help="Scale the lr against tokens per step instead of --base-batch-size.",
        rich_help_panel=LEARNING_RATE,
    ),
]
NumSamples = Annotated[
    int | None, typer.Option(help="Dataset size (adds the sampler).", rich_help_panel=DATA)
]
DropLast = Annotated[
    bool,
    typer.Option(
        help="Sampler: drop what does not split evenly over replicas (default: pad).",
        show_default=False,
        rich_help_panel=DATA,
    ),
]
Shuffle = Annotated[
    bool | None,
    typer.Option(
        "--shuffle/--no-shuffle",
        help="Shuffle every epoch (default: yes on a map-style dataset, no on a --stream: its shard order).",
        show_default=False,
        rich_help_panel=DATA,
    ),
]
DataSeed = Annotated[
    int, typer.Option("--data-seed", help="Sampler shuffle seed (dataset.seed).", rich_help_panel=DATA)
]
Epochs = Annotated[
    int | None, typer.Option(help="Epochs to train (adds the total optimizer steps).", rich_help_panel=DATA)
]
BaseLr = Annotated[
    float | None,
    typer.Option(
        help="Adds the learning rate: the LR tuned for --base-batch-size.", rich_help_panel=LEARNING_RATE
    ),
]
BaseBatch = Annotated[
    int, typer.Option(help="The global batch that --base-lr was tuned for.", rich_help_panel=LEARNING_RATE)
]
Rule = Annotated[
    LRRule,
    typer.Option(
        help="LR scaling; auto: linear for sgd/lars, sqrt for adam-like.", rich_help_panel=LEARNING_RATE
    ),
]
Opt = Annotated[
    Optimizer, typer.Option(help="The optimizer (picks the auto rule).", rich_help_panel=LEARNING_RATE)
]
WarmupEpochs = Annotated[
    float | None,
    typer.Option(help="LR warmup in epochs (needs --num-samples).", rich_help_panel=LEARNING_RATE),
]
WarmupSteps = Annotated[
    int | None, typer.Option(help="LR warmup in optimizer steps.", rich_help_panel=LEARNING_RATE)
]
WarmupStartLr = Annotated[
    float | None,
    typer.Option(help="Where the warmup starts (default: --base-lr).", rich_help_panel=LEARNING_RATE),
]
DecayFlag = Annotated[
    Decay | None,
    typer.Option(
        "--decay",
        help="After warmup: constant (default), cosine, linear, step.",
        rich_help_panel=LEARNING_RATE,
    ),
]
MinLr = Annotated[
    float | None,
    typer.Option(help="Where cosine and linear decay end (default 0).", rich_help_panel=LEARNING_RATE),
]
TrainSteps = Annotated[
    int | None,
    typer.Option(help="The run's optimizer steps (default: --epochs').", rich_help_panel=LEARNING_RATE),
]
TrainSamples = Annotated[
    int | None,
    typer.Option(
        help="The run's length in samples, as Megatron's --train-samples (or --train-steps).",
        rich_help_panel=LEARNING_RATE,
    ),
]
Momentum = Annotated[
    float | None, typer.Option(help="SGD's momentum (default 0.9).", rich_help_panel=LEARNING_RATE)
]
WeightDecay = Annotated[
    float | None,
    typer.Option(help="Weight decay, on every parameter (default 0).", rich_help_panel=LEARNING_RATE),
]
MaxGradNorm = Annotated[
    float | None,
    typer.Option(help="Clip the gradient's norm (default: no clipping).", rich_help_panel=LEARNING_RATE),
]
LrScalingResult = Annotated[
    Path | None,
    typer.Option(
        help="An lr-scaling probe's result, a JSON file (the check as GET /v1/checks/ID answers it, "
        "its result, or result.lr_scaling): the lr scales by the rule it measured best (rule measured).",
        rich_help_panel=LEARNING_RATE,
    ),
]
LrScalingCheck = Annotated[
    str | None,
    typer.Option(
        help="With --url: the id of a finished lr-scaling probe on that server (rule measured).",
        rich_help_panel=LEARNING_RATE,
    ),
]
ResumeStep = Annotated[
    int | None,
    typer.Option(help="Resume after this many optimizer steps (the plan's resume).", rich_help_panel=DATA),
]
ResumeSamples = Annotated[
    int | None,
    typer.Option(
        help="Resume after this many consumed samples, instead of --resume-step.", rich_help_panel=DATA
    ),
]
ResumeReplicas = Annotated[
    int | None,
    typer.Option(
        help="Resume on this data-parallel size (default: the plan's); with `check --resume-at`, the "
        "replicas the checked run goes on with.",
        rich_help_panel=DATA,
    ),
]
RequestFile = Annotated[
    Path | None, typer.Option(help="A JSON plan request (overrides the plan flags).", rich_help_panel=OUTPUT)
]
Url = Annotated[
    str | None,
    typer.Option(
        help="A batchplan server, e.g. http://127.0.0.1:8000 (default: compute here).", rich_help_panel=OUTPUT
    ),
]
ApiKey = Annotated[
    str | None,
    typer.Option(envvar="BATCHPLAN_API_KEY", help="Sent as Authorization: Bearer.", rich_help_panel=OUTPUT),
]
Output = Annotated[
    Path | None,
    typer.Option("--output", "-o", help="Write to this file instead of stdout.", rich_help_panel=OUTPUT),
]


@dataclass(frozen=True)
class BatchFlags:
    """The plan flags of `plan`, `export` and `check`: topology, batch, parallelism, dataset."""

    num_nodes: NumNodes = None
    gpus_per_node: GpusPerNode = None
    node_groups: NodeGroups = None
    throughput_curves: ThroughputCurves = None
    global_batch_size: GlobalBatch = None
    micro_batch_size: MicroBatch = None
    gradient_accumulation_steps: Accumulation = None
    max_micro_batch_size: MaxMicro = None
    divisibility: Div = Divisibility.EXACT
    loss_reduction: Reduction = LossReduction.MEAN
    tensor: Tensor = 1
    pipeline: Pipeline = 1
    context: Context = 1
    data_parallel_shard: DataParallelShard = 1
    expert: Expert = 1
    sequence_length: SequenceLength = None
    global_batch_tokens: GlobalBatchTokens = None
    micro_batch_tokens: MicroBatchTokens = None
    loss_normalization: Normalization = LossNormalization.SAMPLE
    num_samples: NumSamples = None
    drop_last: DropLast = False
    shuffle: Shuffle = None
    data_seed: DataSeed = 0
    epochs: Epochs = None
    stream: StreamFlag = False
    num_shards: NumShards = None
    shard_samples: ShardSamples = None
    splitter: Splitter = None
    num_workers: NumWorkers = None
    end_of_epoch: EndOfEpoch = None


@dataclass(frozen=True)
class PlanFlags(BatchFlags):
    """`plan` and `export` add the learning rate."""

    base_lr: BaseLr = None
    base_batch_size: BaseBatch = 256
    rule: Rule = LRRule.AUTO
    optimizer: Opt = Optimizer.SGD
    warmup_epochs: WarmupEpochs = None
    warmup_steps: WarmupSteps = None
    base_batch_tokens: BaseBatchTokens = None
    warmup_start_lr: WarmupStartLr = None
    decay: DecayFlag = None
    min_lr: MinLr = None
    train_steps: TrainSteps = None
    train_samples: TrainSamples = None
    momentum: Momentum = None
    weight_decay: WeightDecay = None
    max_grad_norm: MaxGradNorm = None
    lr_scaling_result: LrScalingResult = None
    lr_scaling_check: LrScalingCheck = None
    resume_step: ResumeStep = None
    resume_samples: ResumeSamples = None
    resume_replicas: ResumeReplicas = None


@dataclass(frozen=True)
class ExportFlags:
    """What an export writes into its file (`export`'s wording)."""

    script: Annotated[
        str | None, typer.Option(help="The training script (default: train.py).", rich_help_panel=OUTPUT)
    ] = None
    job_name: Annotated[
        str | None, typer.Option(help="Slurm/PyTorchJob name (default: batchplan).", rich_help_panel=OUTPUT)
    ] = None
    image: Annotated[
        str | None, typer.Option(help="The PyTorchJob container image.", rich_help_panel=OUTPUT)
    ] = None
    master_port: Annotated[
        int | None, typer.Option(help="Rendezvous port (default: 29500).", rich_help_panel=OUTPUT)
    ] = None
    preflight: Annotated[
        bool | None,
        typer.Option(
            "--preflight/--no-preflight",
            help="slurm, torchrun, kubernetes: run the gradient check before training (default: on).",
            rich_help_panel=OUTPUT,
        ),
    ] = None
    preflight_steps: Annotated[
        int | None,
        typer.Option(
            help="Optimizer steps the preflight trains (default 1; more: a run of the recipe).",
            rich_help_panel=OUTPUT,
        ),
    ] = None
    model_factory: Annotated[
        str | None,
        typer.Option(
            help="Your model (package.module:factory): the python skeleton builds its loop around it; "
            "the launchers' preflight checks it.",
            rich_help_panel=OUTPUT,
        ),
    ] = None
    setup: Annotated[
        str | None,
        typer.Option(
            help="slurm, torchrun: a shell line that activates the job's environment.", rich_help_panel=OUTPUT
        ),
    ] = None
    cpus_per_gpu: Annotated[
        int | None,
        typer.Option(help="slurm: CPU cores per GPU process (default: 4).", rich_help_panel=OUTPUT),
    ] = None
    elastic_nodes: Annotated[
        str | None,
        typer.Option(
            help="torchrun, slurm: an elastic launch on MIN:MAX nodes (restarts on the nodes left).",
            rich_help_panel=OUTPUT,
        ),
    ] = None
    max_restarts: Annotated[
        int | None,
        typer.Option(
            help="torchrun, slurm: --max-restarts of an elastic launch (default: 3).", rich_help_panel=OUTPUT
        ),
    ] = None

    def query(self) -> Json:
        """The export options as the API takes them (query parameters): only those given."""
        given = {
            "script": self.script,
            "job_name": self.job_name,
            "image": self.image,
            "port": self.master_port,
            "preflight": self.preflight,
            "preflight_steps": self.preflight_steps,
            "model_factory": self.model_factory,
            "setup": self.setup,
            "cpus_per_gpu": self.cpus_per_gpu,
            "elastic_nodes": self.elastic_nodes,
            "max_restarts": self.max_restarts,
        }
        return {k: v for k, v in given.items() if v is not None}


@dataclass(frozen=True)
class PlanExportFlags(ExportFlags):
    """The same options on `plan`, where only an export --format uses them."""

    script: Annotated[
        str | None,
        typer.Option(help="Exports: the training script (default: train.py).", rich_help_panel=OUTPUT),
    ] = None
    job_name: Annotated[
        str | None,
        typer.Option(help="Exports: Slurm/PyTorchJob name (default: batchplan).", rich_help_panel=OUTPUT),
    ] = None
    image: Annotated[
        str | None, typer.Option(help="Exports: the PyTorchJob container image.", rich_help_panel=OUTPUT)
    ] = None
    master_port: Annotated[
        int | None, typer.Option(help="Exports: rendezvous port (default: 29500).", rich_help_panel=OUTPUT)
    ] = None
