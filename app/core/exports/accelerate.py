"""`accelerate`: a Hugging Face Accelerate config (YAML), with the launch line and the
training-script calls that carry the batch size and accumulation as comments."""

from __future__ import annotations

from typing import Any

from app.core.exports.common import (
    Export,
    ExportInput,
    comment,
    num_nodes,
    require_data_parallel,
    require_even,
    require_uniform_nodes,
    summary,
)
from app.core.exports.training import leftover_sentence, optimizer_sentence, schedule_sentence
from app.core.exports.yaml_writer import to_yaml


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
    code = [
        f"Launch: {launch}",
        *(
            [f"  on each node, with NODE_RANK its index (0 to {nodes - 1}) and MASTER_ADDR node 0's address"]
            if nodes > 1
            else []
        ),
        "In the training script:",
        f"  accelerator = Accelerator(gradient_accumulation_steps={p.gradient_accumulation_steps})",
        f"  loader = DataLoader(dataset, batch_size={p.micro_batch_size}, shuffle=True)  # per process",
        "  model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)",
        "  with accelerator.accumulate(model): ... accelerator.backward(loss)  # divides by the accumulation",
    ]
    if p.learning_rate is not None:
        code.append(f"  {optimizer_sentence(x)}; {schedule_sentence(x)}")
    text = (
        comment(summary(x) + leftover_sentence(x, "accelerator.accumulate") + code)
        + "\n"
        + to_yaml(config)
        + "\n"
    )
    return Export("accelerate", "application/yaml", "accelerate_config.yaml", text)
