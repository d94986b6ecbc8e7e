"""The minimal reproduction behind the context-parallel refusal (mesh_spec.py): two gloo ranks
on CPU, torch's context_parallel around scaled_dot_product_attention. Run under torchrun with
2 processes; rank 0 prints what torch did, as JSON. Not a test module.

With torch 2.13.0+cpu the forward runs and matches whole attention (1e-16), and the backward a
training step needs raises NotImplementedError: aten._scaled_dot_product_flash_attention_for_cpu
_backward has no sharding strategy registered.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import context_parallel_unshard
from torch.nn import functional

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
generator = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 2, 8, 4, generator=generator, dtype=torch.float64) for _ in range(3))
weight = torch.ones(1, dtype=torch.float64, requires_grad=True)  # a parameter to train
whole = functional.scaled_dot_product_attention(q, k, v)
outcome: dict[str, object] = {"torch": torch.__version__}
# One forward, compared with whole attention, then its backward inside the same context:
# DTensor's sharding propagation of the CPU attention op takes about 15 CPU-s per rank per
# distinct forward, so the forward is not run twice.
try:
    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        local = functional.scaled_dot_product_attention(q * weight, k, v)
        outcome["forward_ran"] = True
        outcome["local_shape"] = list(local.shape)
        (gathered,) = context_parallel_unshard(mesh, [local.detach()], [2])
        outcome["max_abs_diff_from_whole"] = float((gathered - whole).abs().max())
        local.sum().backward()
    outcome["backward_ran"] = True
except Exception as err:  # the point of the reproduction: what torch raises on CPU
    outcome["error"] = f"{type(err).__name__}: {err}"
if dist.get_rank() == 0:
    print(json.dumps(outcome), flush=True)
dist.destroy_process_group()
