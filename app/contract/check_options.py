"""What a gradient check takes besides the plan, and its defaults, stated once: the HTTP
schema, the CLI, the rank program and the worker all read them here."""

from __future__ import annotations

from typing import Literal, get_args

Backend = Literal["auto", "gloo", "nccl"]
ProcessGroupBackend = Literal["gloo", "nccl"]  # what `auto` became on the host
DType = Literal["float64", "float32"]
CheckWorkload = Literal["synthetic", "tokens"]
# Whose state the memory probe's optimizer step allocates ("none": weights and gradients only).
FitOptimizer = Literal["adam", "adamw", "sgd", "none"]

BACKENDS: tuple[str, ...] = get_args(Backend)
DTYPES: tuple[str, ...] = get_args(DType)
FIT_OPTIMIZERS: tuple[str, ...] = get_args(FitOptimizer)

DEFAULT_BACKEND: Backend = "auto"
DEFAULT_DTYPE: DType = "float64"
# Optimizer steps a registered model's noise scale is measured over unless the request says.
DEFAULT_NOISE_STEPS = 8
# Where the search for the largest micro-batch stops, and the optimizer its probe runs.
DEFAULT_FIT_LIMIT = 65536
DEFAULT_FIT_OPTIMIZER: FitOptimizer = "adam"
# Optimizer steps a check trains (1: the one-step check); more train the plan's recipe as a run.
DEFAULT_STEPS = 1
MAX_STEPS = 1000
# The throughput measurement (contract/kinds/throughput.py): repeats timed per micro-batch after the
# warm-up micro-steps, the knee's margin below the fastest samples/s, the largest default size
# without a cap, and the most points one measurement takes.
DEFAULT_THROUGHPUT_REPEATS = 10
DEFAULT_THROUGHPUT_WARMUP = 3
DEFAULT_KNEE_MARGIN = 0.05
DEFAULT_THROUGHPUT_LIMIT = 128
MAX_THROUGHPUT_POINTS = 32
# The lr-scaling probe (contract/kinds/lr_scaling.py): the rules it runs unless told, its
# evaluations along the way, and how close to the base run a rule's final loss must stay.
LR_PROBE_RULES: tuple[str, ...] = ("none", "sqrt", "linear")
DEFAULT_LR_PROBE_POINTS = 8
MAX_LR_PROBE_POINTS = 64
DEFAULT_LR_PROBE_TOLERANCE = 0.05  # relative: a loss that falls towards zero
# Absolute, in nats, for the tokens workload's cross-entropy (a 2-nat loss makes 5 % a tenth of a
# nat, which passed an lr twice too low in issue 47's language model).
DEFAULT_LR_PROBE_NATS = 0.02
DEFAULT_LR_PROBE_SEEDS = 3
MAX_LR_PROBE_SEEDS = 8  # the built-in model's seeds take disjoint index ranges below its noise batch
MAX_LR_PROBE_SAMPLES = 1 << 24
MAX_LR_PROBE_EPOCHS = 10_000  # the samples they come to are held to MAX_LR_PROBE_SAMPLES apart
