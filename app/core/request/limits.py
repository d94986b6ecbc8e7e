"""The ranges of CONTRACT.md "Limits", written once: each plan request field's path -> its
bounds (app.core.request.bounds).

The HTTP schema's field types read their bounds here (app.schemas.types.plan_limit), and
`PLAN_LIMITS.check` holds JSON that did not come through that schema to the same table: the
rank program's `--request` and a stored job (`app.contract.request.check_request`, through the
check request's table, app.contract.limits, which holds these under `plan`). The planner trusts
its request and checks none of this again: a request is validated once, where it comes in.
tests/core/test_limits_table.py holds the schema's bounds equal to this table's.
"""

from __future__ import annotations

from app.core.records.plan_request import MAX_SAFE_INTEGER, MAX_WORLD_SIZE
from app.core.request.bounds import Bounds, Limits

MAX_EPOCHS = 1_000_000  # dataset.epochs, warmup and milestones in epochs: a run, not a forever
MAX_NODE_GROUPS = 10_000
MAX_CURVE_POINTS = 64
MAX_MILESTONES = 100
# A rate below this is no measurement (a sample every 11 days), and it would round a split's
# integer weights to zero.
MIN_SAMPLES_PER_S = 1e-6
MAX_FLOPS_PER_TOKEN = 1e20
MAX_PROBE_RULES = 16  # an lr-scaling probe's answer, as a plan takes it back
MAX_PROBE_POINTS = 1000
# A stream's shards (app.core.split.stream.layout counts them: in closed form up to the first,
# a listed shard_samples shard by shard up to the second) and DataLoader workers per rank.
MAX_STREAM_SHARDS = 1_000_000
MAX_LISTED_SHARDS = 100_000
MAX_WORKERS = 1024

COUNT = Bounds("int", ge=1, le=MAX_SAFE_INTEGER)  # batch and dataset sizes, steps of a run
FROM_ZERO = Bounds("int", ge=0, le=MAX_SAFE_INTEGER)  # a seed, steps already taken
GPUS = Bounds("int", ge=1, le=MAX_WORLD_SIZE)  # a plan covers at most this many GPUs
POSITIVE = Bounds("float", gt=0)  # throughputs, learning rates, a noise scale
NON_NEGATIVE = Bounds("float", ge=0)
FRACTION = Bounds("float", ge=0, lt=1)  # betas, momentum
CURVE = Bounds("items", ge=1, le=MAX_CURVE_POINTS, allow_null=True)
RATE = Bounds("float", ge=MIN_SAMPLES_PER_S)
PROBE_POINTS = Bounds("items", le=MAX_PROBE_POINTS, allow_null=True)
EPOCHS = Bounds("int", ge=1, le=MAX_EPOCHS)
MILESTONES = Bounds("items", ge=1, le=MAX_MILESTONES, allow_null=True)

# The plan request (POST /v1/plans, a check's `plan`): every field with a bound, nowhere else.
_PLAN = {
    "topology.num_nodes": GPUS.nullable,
    "topology.gpus_per_node": GPUS.nullable,
    "topology.throughput_curve": CURVE,
    "topology.throughput_curve[].micro_batch_size": COUNT,
    "topology.throughput_curve[].samples_per_s": RATE,
    "topology.node_groups": Bounds("items", ge=1, le=MAX_NODE_GROUPS, allow_null=True),
    "topology.node_groups[].num_nodes": GPUS,
    "topology.node_groups[].gpus_per_node": GPUS,
    "topology.node_groups[].relative_throughput": POSITIVE,
    "topology.node_groups[].max_micro_batch_size": COUNT.nullable,
    "topology.node_groups[].throughput_curve": CURVE,
    "topology.node_groups[].throughput_curve[].micro_batch_size": COUNT,
    "topology.node_groups[].throughput_curve[].samples_per_s": RATE,
    "global_batch_size": COUNT.nullable,
    "micro_batch_size": COUNT.nullable,
    "gradient_accumulation_steps": COUNT.nullable,
    "max_micro_batch_size": COUNT.nullable,
    # A parallel size above the most GPUs a plan covers could never divide its world.
    "parallelism.tensor": GPUS,
    "parallelism.pipeline": GPUS,
    "parallelism.context": GPUS,
    "parallelism.data_parallel_shard": GPUS,
    "parallelism.expert": GPUS,
    "dataset.num_samples": COUNT.nullable,  # a stream may give shard_samples instead
    "dataset.num_shards": Bounds("int", ge=1, le=MAX_STREAM_SHARDS, allow_null=True),
    "dataset.shard_samples": Bounds("items", ge=1, le=MAX_LISTED_SHARDS, allow_null=True),
    "dataset.shard_samples[]": COUNT,
    "dataset.num_workers": Bounds("int", ge=0, le=MAX_WORKERS, allow_null=True),
    "dataset.seed": FROM_ZERO,
    "dataset.epochs": EPOCHS.nullable,
    "learning_rate.base_lr": POSITIVE.nullable,  # beside recommend, the law gives it
    "learning_rate.base_batch_size": COUNT,
    "learning_rate.warmup_epochs": Bounds("float", ge=0, le=MAX_EPOCHS, allow_null=True),
    "learning_rate.warmup_steps": FROM_ZERO.nullable,
    "learning_rate.betas": Bounds("items", ge=2, le=2),
    "learning_rate.betas[]": FRACTION,
    "learning_rate.eps": POSITIVE,
    "learning_rate.base_batch_tokens": COUNT.nullable,
    "learning_rate.warmup_start_lr": NON_NEGATIVE.nullable,
    "learning_rate.min_lr": NON_NEGATIVE.nullable,
    "learning_rate.milestones": MILESTONES,
    "learning_rate.milestones[]": COUNT,
    "learning_rate.milestone_epochs": MILESTONES,
    "learning_rate.milestone_epochs[]": Bounds("float", gt=0, le=MAX_EPOCHS),
    "learning_rate.gamma": Bounds("float", gt=0, lt=1),
    "learning_rate.train_steps": COUNT.nullable,
    "learning_rate.train_samples": COUNT.nullable,
    "learning_rate.momentum": FRACTION.nullable,
    "learning_rate.weight_decay": Bounds("float", ge=0, le=1),
    "learning_rate.max_grad_norm": POSITIVE.nullable,
    "learning_rate.lr_scaling.base.batch_size": COUNT,
    "learning_rate.lr_scaling.base.lr": POSITIVE,
    "learning_rate.lr_scaling.base.curve": PROBE_POINTS,
    "learning_rate.lr_scaling.rules": Bounds("items", le=MAX_PROBE_RULES),
    "learning_rate.lr_scaling.rules[].lr": POSITIVE.nullable,
    "learning_rate.lr_scaling.rules[].curve": PROBE_POINTS,
    "learning_rate.lr_scaling.rules[].final_loss_ratio": POSITIVE.nullable,
    "gradient_noise_scale": POSITIVE.nullable,
    "gradient_noise_scale_stderr": NON_NEGATIVE.nullable,
    "sequence_length": COUNT.nullable,
    "global_batch_tokens": COUNT.nullable,
    "micro_batch_tokens": COUNT.nullable,
    "packing.max_tokens_per_micro_batch": COUNT.nullable,
    # A document holds at least one token; its mean is a float (a corpus's average).
    "packing.document_length.mean": Bounds("float", ge=1.0, allow_null=True),
    "packing.document_length.max": COUNT.nullable,
    "resume.optimizer_step": FROM_ZERO.nullable,
    "resume.consumed_samples": FROM_ZERO.nullable,
    "resume.data_parallel_size": GPUS.nullable,
    "recommend.train_tokens": COUNT,
    "recommend.non_embedding_params": COUNT.nullable,
    # FLOPs per token of a model with some 1e19 weights: far past any, short of overflowing C = M x D.
    "recommend.flops_per_token": Bounds("float", gt=0, le=MAX_FLOPS_PER_TOKEN, allow_null=True),
    "recommend.measured_noise_scale": POSITIVE.nullable,
    "recommend.architecture.layers": COUNT,
    "recommend.architecture.hidden_size": COUNT,
    "recommend.architecture.ffn_hidden_size": COUNT,
    "recommend.architecture.num_heads": COUNT,
    "recommend.architecture.num_kv_heads": COUNT.nullable,
    "recommend.architecture.vocab_size": COUNT.nullable,
}


PLAN_LIMITS = Limits(_PLAN)
