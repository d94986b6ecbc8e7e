"""Frozen inputs and outputs of the planner. Plain dataclasses: no web types here.

The inputs live here; the outputs (Plan and its parts) in app.core.records.plan, re-exported
so that `plan_types.Plan` keeps working wherever it is named."""

from __future__ import annotations

from dataclasses import fields
from enum import StrEnum
from typing import Literal

from app.core.records.recommendation import RecommendSpec
from app.core.records.record import record
from app.core.records.resume import ResumeSpec
from app.core.records.stream import EndOfEpoch, Splitter, StreamSpec
from app.core.records.throughput_curve import ThroughputCurve

# Limits shared by the core and the HTTP schema (CONTRACT.md, "Limits").
MAX_SAFE_INTEGER = 2**53 - 1  # exact in every JSON client
MAX_WORLD_SIZE = 10_000_000


class Divisibility(StrEnum):
    EXACT = "exact"
    ROUND_DOWN = "round_down"
    ROUND_UP = "round_up"
    BALANCE = "balance"


class LossReduction(StrEnum):
    MEAN = "mean"
    SUM = "sum"


class LossNormalization(StrEnum):
    SAMPLE = "sample"  # each sample's loss weighs the same (the loss_reduction applies)
    TOKEN = "token"  # each valid token weighs the same: sum over tokens / the step's global count


class PackingMode(StrEnum):
    ROWS = "rows"  # documents packed into rows of sequence_length (DataCollatorWithFlattening)
    TOKEN_BUDGET = "token_budget"  # variable-length samples, a micro-batch filled up to a token budget


class Optimizer(StrEnum):
    SGD = "sgd"
    LARS = "lars"
    ADAM = "adam"
    ADAMW = "adamw"
    LAMB = "lamb"


class LRRule(StrEnum):
    LINEAR = "linear"
    SQRT = "sqrt"
    NONE = "none"
    AUTO = "auto"
    MEASURED = "measured"  # the best rule of an lr-scaling probe (app.core.learning_rate.evidence)


class Decay(StrEnum):
    """What the lr does after warmup (app.core.learning_rate.lr_schedule.lr_at)."""

    COSINE = "cosine"
    LINEAR = "linear"
    CONSTANT = "constant"
    STEP = "step"  # x gamma at each milestone (Goyal et al. 2017)


@record
class NodeGroup:
    name: str
    num_nodes: int
    gpus_per_node: int
    relative_throughput: float = 1.0
    max_micro_batch_size: int | None = None
    # Measured samples/s per micro-batch of one replica (app.core.records.throughput_curve): the split is
    # then planned from curves, and relative_throughput is not used.
    throughput_curve: ThroughputCurve | None = None

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


@record
class Topology:
    node_groups: tuple[NodeGroup, ...]
    # True when the request listed node_groups; pointers in errors follow the request's shape.
    listed_groups: bool = False

    @classmethod
    def homogeneous(
        cls, num_nodes: int, gpus_per_node: int, curve: ThroughputCurve | None = None
    ) -> Topology:
        group = NodeGroup("default", num_nodes, gpus_per_node, throughput_curve=curve)
        return cls((group,), listed_groups=False)

    @property
    def curves(self) -> bool:
        """Whether the split is planned from measured curves (every group has one, or the
        request is refused: app.core.cluster.topology.validate_topology)."""
        groups = self.node_groups
        if len(groups) == 1:  # the usual request, without a generator
            return groups[0].throughput_curve is not None
        return any(g.throughput_curve is not None for g in groups)

    @property
    def world_size(self) -> int:
        return sum(g.num_gpus for g in self.node_groups)


@record
class Parallelism:
    tensor: int = 1
    pipeline: int = 1
    context: int = 1
    # 1: DDP; the data-parallel size: FSDP; a proper divisor: HSDP (app.core.cluster.device_mesh).
    data_parallel_shard: int = 1
    expert: int = 1  # borrows ranks from dp_shard x cp x tp; never changes the world size

    @property
    def model_parallel_size(self) -> int:
        return self.tensor * self.pipeline * self.context


DatasetKind = Literal["map", "stream"]


@record
class DatasetSpec:
    """A map-style dataset (DistributedSampler's) or a stream (an IterableDataset in shards,
    split by `splitter`: app.core.split.stream). `num_samples` is every sample either way: a
    stream asked with `shard_samples` holds their sum. The fields after `kind` are a stream's
    (app.core.request.parse refuses them on a map), as `stream` hands them to its planner."""

    num_samples: int
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    epochs: int | None = None
    kind: DatasetKind = "map"
    num_shards: int | None = None
    shard_samples: tuple[int, ...] | None = None
    splitter: Splitter | None = None
    num_workers: int = 0
    end_of_epoch: EndOfEpoch = "drop"

    def __repr__(self) -> str:
        # A map's repr is what it was before streams: exports hash it into a run's identity
        # (RUN_ID), and a run exported again must still know its own checkpoints.
        shown: tuple[str, ...] = ("num_samples", "shuffle", "seed", "drop_last", "epochs")
        if self.kind != "map":
            shown = tuple(f.name for f in fields(self))
        return f"DatasetSpec({', '.join(f'{name}={getattr(self, name)!r}' for name in shown)})"

    @property
    def stream(self) -> StreamSpec | None:
        """The stream as its planner takes it (None on a map): shard_samples as asked, else
        num_samples shared out over num_shards."""
        if self.kind != "stream" or self.num_shards is None:
            return None
        listed = self.shard_samples is not None
        return StreamSpec(
            num_shards=self.num_shards,
            splitter=self.splitter,
            shard_samples=self.shard_samples,
            num_samples=None if listed else self.num_samples,
            num_workers=self.num_workers,
            shuffle=self.shuffle,
            seed=self.seed,
            end_of_epoch=self.end_of_epoch,
        )


@record
class ProbeRun:
    """One rule's run in an lr-scaling probe (`POST /v1/checks` with `lr_scaling`)."""

    rule: str
    lr: float | None = None
    final_loss_ratio: float | None = None  # its final loss over the base run's
    holds: bool | None = None  # it stayed within the probe's tolerance of the base run


@record
class LrScaling:
    """What the plan reads of an lr-scaling probe's result (`lr_scaling`)."""

    best_rule: str | None
    rules: tuple[ProbeRun, ...] = ()
    base_batch_size: int | None = None  # the probe's base run
    base_lr: float | None = None
    plan_rule_holds: bool | None = None
    regime: str | None = None
    verdict: str | None = None


@record
class LearningRateSpec:
    base_lr: float | None  # None only with the request's recommend: the law gives it
    base_batch_size: int = 256
    rule: LRRule = LRRule.AUTO
    optimizer: Optimizer = Optimizer.SGD
    warmup_epochs: float | None = None
    warmup_steps: int | None = None
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    base_batch_tokens: int | None = None  # scale against tokens per step instead (app.core.tokens.token_plan)
    # The rest of the recipe (app.core.learning_rate.recipe). None where the default depends on other fields.
    warmup_start_lr: float | None = None  # None: base_lr (Goyal et al.)
    decay: Decay | None = None  # None: constant
    min_lr: float | None = None  # None: 0 (cosine and linear decay end there)
    milestones: tuple[int, ...] | None = None  # step decay, in optimizer steps
    milestone_epochs: tuple[float, ...] | None = None  # or in epochs (needs dataset)
    gamma: float = 0.1
    train_steps: int | None = None  # the run's length; default dataset.epochs' optimizer steps
    train_samples: int | None = None
    momentum: float | None = None  # SGD and LARS; None: 0.9
    nesterov: bool = False
    weight_decay: float = 0.0  # torch's: L2 in SGD and Adam, decoupled in AdamW; every parameter
    max_grad_norm: float | None = None  # None: no clipping
    # rule "measured": the probe's numbers, or the id of its check (looked up by the server,
    # which then fills lr_scaling in and keeps the id to cite it).
    lr_scaling: LrScaling | None = None
    lr_scaling_check: str | None = None


@record
class DocumentLength:
    """What is known of the documents' lengths, in tokens (app.core.tokens.packing)."""

    mean: float | None = None
    max: int | None = None


@record
class PackingSpec:
    """How a language-model batch is laid out when tokens per rank vary (app.core.tokens.packing)."""

    mode: PackingMode
    max_tokens_per_micro_batch: int | None = None  # token_budget only: the budget T
    document_length: DocumentLength | None = None


@record
class PlanRequest:
    topology: Topology
    global_batch_size: int | None = None
    micro_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    max_micro_batch_size: int | None = None
    divisibility: Divisibility = Divisibility.EXACT
    parallelism: Parallelism = Parallelism()
    loss_reduction: LossReduction = LossReduction.MEAN
    dataset: DatasetSpec | None = None
    learning_rate: LearningRateSpec | None = None
    # Samples: B_simple or B_noise, as a gradient check measures it (app.core.learning_rate.noise_scale).
    gradient_noise_scale: float | None = None
    gradient_noise_scale_stderr: float | None = None  # only with gradient_noise_scale
    # Language models (app.core.tokens.token_plan): the batch in tokens, and how the loss is normalised.
    sequence_length: int | None = None
    global_batch_tokens: int | None = None
    micro_batch_tokens: int | None = None
    loss_normalization: LossNormalization = LossNormalization.SAMPLE
    packing: PackingSpec | None = None  # packed rows or token budgets: unequal tokens per rank
    # Where a checkpointed run goes on, and on how many replicas (app.core.resume.plan_resume).
    resume: ResumeSpec | None = None
    # A published scaling law's batch and lr for the model (app.core.learning_rate.recommend).
    recommend: RecommendSpec | None = None
