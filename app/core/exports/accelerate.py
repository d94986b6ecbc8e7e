"""`accelerate`: a Hugging Face Accelerate config (YAML), with the training-script calls that
carry the batch size and accumulation as comments."""

from __future__ import annotations

from typing import Any

from app.core.exports.common import (
    Export,
    ExportInput,
    comment,
    lr_values,
    num_nodes,
    require_even,
    require_uniform_nodes,
    summary,
)
from app.core.exports.yaml_writer import to_yaml


def export_accelerate(x: ExportInput) -> Export:
    require_even(x, "Accelerate", "gives every process the same DataLoader batch size")
    shape = require_uniform_nodes(x, "Accelerate")
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
    if nodes > 1:
        config |= {
            "main_process_ip": "MASTER_ADDR",
            "main_process_port": x.options.port,
            "rdzv_backend": "static",
            "same_network": True,
        }
    lr, warmup, _ = lr_values(x)
    code = [
        "In the training script:",
        f"  accelerator = Accelerator(gradient_accumulation_steps={p.gradient_accumulation_steps})",
        f"  loader = DataLoader(dataset, batch_size={p.micro_batch_size}, shuffle=True)  # per process",
        "  model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)",
        "  with accelerator.accumulate(model): ... accelerator.backward(loss)  # divides by the accumulation",
    ]
    if lr is not None:
        code.append(f"  optimizer lr = {lr!r}, warmup {warmup} optimizer steps")
    if nodes > 1:
        code.append("Set main_process_ip to node 0's address and machine_rank to each node's index.")
    text = comment(summary(x) + code) + "\n" + to_yaml(config) + "\n"
    return Export("accelerate", "application/yaml", "accelerate_config.yaml", text)
