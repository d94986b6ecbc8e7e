"""`accelerate`: a Hugging Face Accelerate config (YAML), with the launch line and, as comments,
the training function that runs the plan's recipe under Accelerate.

The function keeps two things away from `accelerator.prepare`: the scheduler (an
`AcceleratedScheduler` steps it once per process per optimizer step unless `split_batches`,
so the warmup would end num_processes times too early) and the loader (Accelerate shards the
batches of one loader across processes and pads the epoch's end its own way, not as the
plan's DistributedSampler does). It drops an epoch's leftover micro-batches, as the plan does.
A stream plan's function splits the stream once instead (parts/accelerate_stream.py).
"""

from __future__ import annotations

import textwrap
from typing import Any

from app.core.exports.parts.accelerate_stream import ACCUMULATE_STEP, PREPARE, stream_train_code
from app.core.exports.parts.common import (
    comment,
    num_nodes,
    require_data_parallel,
    require_even,
    require_uniform_nodes,
    summary,
)
from app.core.exports.parts.export_types import Export, ExportInput
from app.core.exports.parts.hf_trainer_stream import stream_notes
from app.core.exports.parts.python_literal import py_literal
from app.core.exports.parts.recipe_code import (
    lr_block,
    optimizer_call,
    optimizer_note,
    recipe,
    scheduler_call,
)
from app.core.exports.parts.resume_notes import resume_notes
from app.core.exports.parts.training import leftover_sentence
from app.core.exports.parts.yaml_writer import to_yaml

# The start and end of the training code in the header: tests (and people) cut it out there.
CODE_START = "---- training script ----"
CODE_END = "---- end of training script ----"

_TRAIN = (
    '''
def train(model, dataset, loss_fn):
    """Train `model` on `dataset` (items (inputs, targets)) with the plan's recipe."""
    accelerator = Accelerator(gradient_accumulation_steps=__ACCUM__)
    # The plan's sampler, not Accelerate's: left unprepared, each process reads its own shard.
    sampler = DistributedSampler(
        dataset, num_replicas=accelerator.num_processes, rank=accelerator.process_index,
        shuffle=__SHUFFLE__, seed=__SEED__, drop_last=__DROP_LAST__,
    )
    loader = DataLoader(dataset, batch_size=__MICRO__, sampler=sampler)  # per process
__MICRO_STEPS__    # __NOTE__
'''
    + PREPARE
    + """__STEP_INIT__    __LOOP__
        sampler.set_epoch(epoch)  # reshuffles with seed + epoch
        for inputs, targets in __BATCHES__:
"""
    + ACCUMULATE_STEP
    + """__STOP__    return model
"""
)

_MICRO_STEPS = """\
    # The micro-batches up to the epoch's last whole optimizer step; the plan drops the rest.
    micro_steps = len(loader) // __ACCUM__ * __ACCUM__
"""

_CLIP = """                if accelerator.sync_gradients:  # the all-reduced gradient, one global norm
                    accelerator.clip_grad_norm_(model.parameters(), __NORM__)
"""

_STOP = """                step += 1
                if step == __TRAIN_STEPS__:  # the run's last optimizer step
                    return model
"""


def _loop(x: ExportInput) -> tuple[str, bool]:
    """The epoch loop's first line, and whether the run may stop inside an epoch."""
    p = x.plan
    lr, _ = recipe(x)
    epochs = p.sampler.epochs if p.sampler and p.sampler.epochs else None
    steps_per_epoch = p.sampler.optimizer_steps_per_epoch if p.sampler else None
    if epochs is None and lr.train_steps is not None:
        return "for epoch in itertools.count():  # until the run's last step", True
    if epochs is None:
        return "for epoch in range(1):  # the plan has no dataset.epochs: one epoch", False
    stops = lr.train_steps is not None and lr.train_steps != epochs * (steps_per_epoch or 0)
    return f"for epoch in range({epochs}):", stops


def _stream_imports() -> list[str]:
    return [
        "import itertools",
        "import math",
        "",
        "import torch",
        "from accelerate import Accelerator",
        "from datasets.distributed import split_dataset_by_node",
        "from torch.utils.data import DataLoader",
        "",
        "",
    ]


def training_code(x: ExportInput) -> list[str]:
    """The training function, as the lines the header shows (uncommented)."""
    p = x.plan
    lr, o = recipe(x)
    accumulation = p.gradient_accumulation_steps
    loop, stops = _loop(x)
    code = _TRAIN if p.stream is None else stream_train_code(x)[0]
    for token, value in {
        "__MICRO_STEPS__": _MICRO_STEPS if accumulation > 1 else "",
        "__BATCHES__": "itertools.islice(loader, micro_steps)" if accumulation > 1 else "loader",
        "__LOOP__": loop,
        "__STOP__": _STOP if stops else "",
        "__STEP_INIT__": "    step = 0\n" if stops else "",
        "__CLIP__": _CLIP.replace("__NORM__", py_literal(o.max_grad_norm))
        if o.max_grad_norm is not None
        else "",
        "__ACCUM__": str(accumulation),
        "__MICRO__": str(p.micro_batch_size),
        "__SHUFFLE__": py_literal(p.sampler.shuffle if p.sampler else True),
        "__SEED__": py_literal(p.sampler.seed if p.sampler else 0),
        "__DROP_LAST__": py_literal(p.sampler.drop_last if p.sampler else False),
        "__NOTE__": optimizer_note(x) or f"torch.optim.{o.torch_class}, every parameter in one group",
        "__OPTIMIZER__": optimizer_call(x, "model.parameters()"),
        "__SCHEDULER__": scheduler_call(x, "optimizer"),
        "__TRAIN_STEPS__": py_literal(lr.train_steps),
    }.items():
        code = code.replace(token, value)
    imports = (
        _stream_imports()
        if p.stream is not None
        else [
            *(["import itertools"] if "itertools." in code else []),
            "import math",
            "",
            "import torch",
            "from accelerate import Accelerator",
            "from torch.utils.data import DataLoader, DistributedSampler",
            "",
            "",
        ]
    )
    return [CODE_START, *imports, *lr_block(x).splitlines(), "", *code.splitlines(), CODE_END]


def _script_sentence(x: ExportInput) -> str:
    p = x.plan
    if p.stream is not None:
        return (
            "In the training script: call train(model, stream, loss_fn, collate_fn) with the whole "
            "datasets.IterableDataset (load_dataset(..., streaming=True)). train() splits it once with "
            "split_dataset_by_node, in a DataLoader kept out of accelerator.prepare (which reads an "
            "IterableDataset on rank 0 alone and hands out slices, or with dispatch_batches=False splits it "
            "again); the scheduler stays out too: a prepared scheduler steps once per process per optimizer "
            "step."
        )
    return (
        "In the training script (Accelerator(gradient_accumulation_steps="
        f"{p.gradient_accumulation_steps}), "
        f"DataLoader(dataset, batch_size={p.micro_batch_size}, ...) per process): call train(model, "
        "dataset, loss_fn). The scheduler and the loader stay out of accelerator.prepare: a prepared "
        "scheduler steps once per process per optimizer step, a prepared loader splits batches, not "
        "samples."
    )


def export_accelerate(x: ExportInput) -> Export:
    # The node shape first: no batch size makes nodes of different sizes one process count.
    shape = require_uniform_nodes(x, "Accelerate")
    require_even(x, "Accelerate", "gives every process the same DataLoader batch size")
    require_data_parallel(x, "Accelerate's MULTI_GPU mode")
    p, nodes = x.plan, num_nodes(x)
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "MULTI_GPU",
        "num_machines": nodes,
        "num_processes": nodes * shape,  # all processes, not per machine
        "machine_rank": 0,
        "gpu_ids": "all",
        "mixed_precision": "no",
        "use_cpu": False,
        "downcast_bf16": "no",
    }
    launch = f"accelerate launch --config_file accelerate_config.yaml {x.options.script}"
    if nodes > 1:
        # The address is node 0's, known only where the job runs: the launch line passes it
        # (a value written here would be read as a literal host name).
        config |= {"main_process_port": x.options.port, "rdzv_backend": "static", "same_network": True}
        launch = (
            "accelerate launch --config_file accelerate_config.yaml --machine_rank $NODE_RANK "
            f'--main_process_ip "$MASTER_ADDR" {x.options.script}'
        )
    lines = [
        f"Launch: {launch}",
        *(
            [f"  on each node, with NODE_RANK its index (0 to {nodes - 1}) and MASTER_ADDR node 0's address"]
            if nodes > 1
            else []
        ),
        *textwrap.wrap(_script_sentence(x), 92),
        *training_code(x),
    ]
    header = summary(x) + leftover_sentence(x, "train() stops each epoch before them")
    header += stream_notes(x, "train()") if p.stream is not None else []
    header += resume_notes(x, "accelerate")
    text = comment(header + lines) + "\n" + to_yaml(config) + "\n"
    return Export("accelerate", "application/yaml", "accelerate_config.yaml", text)
