"""Which process-group backend and device a rank uses: NCCL with one GPU per local rank when
the host has them, else gloo on CPU. The warm ranks and the rank program under torchrun
decide alike."""

from __future__ import annotations

import torch
import torch.distributed as dist

from app.contract.check_options import ProcessGroupBackend


def choose_backend(
    requested: str, local_processes: int, local_index: int
) -> tuple[ProcessGroupBackend, torch.device]:
    """NCCL with one rank per GPU when this host has a GPU for every local rank, else gloo on CPU."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = dist.is_nccl_available() and gpus >= local_processes
    if requested == "nccl" and not nccl:
        raise RuntimeError(f"backend nccl needs {local_processes} GPUs on this host; it has {gpus}")
    if requested != "gloo" and nccl:
        return "nccl", torch.device("cuda", local_index)
    return "gloo", torch.device("cpu")
