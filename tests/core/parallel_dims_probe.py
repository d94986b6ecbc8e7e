"""Run by tests/core/test_device_mesh_torchtitan.py as a process of its own: reads a JSON list
of layouts ({"world", "dp_replicate", "dp_shard", "cp", "tp", "pp", "ep"}) on stdin and prints
"RESULT " and, for each, what torchtitan's own `ParallelDims` makes of it, as JSON.

torchtitan 0.2.2's `ParallelDims` (distributed/parallel_dims.py, imported as installed, its
package registered without the `__init__` that needs triton: torchtitan_loader.py) is built with
the layout's degrees and expert tensor parallel 1 (its default), then `build_mesh()` lays out
every mesh it trains on (dataloading pp x batch x cp x tp, dense pp x dp_replicate x fsdp x tp,
sparse pp x dp_replicate x efsdp x ep x etp) on a fake process group of the layout's world size
(torch's own "fake" backend: no peers, no devices; every dimension's group the world group),
its `device_type` set to cpu. A layout it
refuses, at construction or while building, answers {"error": ...}; one it builds answers each
one-dimensional mesh's size, the enabled ones (`get_all_one_dimensional_meshes`), and the
properties its models' parallelize functions pick the data-parallel wrapper by.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

sys.path.insert(0, str(Path(__file__).parent))
from torchtitan_loader import _package_without_init


def built(layout: dict[str, Any]) -> dict[str, Any]:
    from torchtitan.distributed.parallel_dims import ParallelDims

    world = layout["world"]
    # A group per layout: every mesh built adds process groups to the default one, and torch
    # slows as they pile up.
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        dims = ParallelDims(
            dp_replicate=layout["dp_replicate"],
            dp_shard=layout["dp_shard"],
            cp=layout["cp"],
            tp=layout["tp"],
            pp=layout["pp"],
            ep=layout["ep"],
            etp=1,
            world_size=world,
        )
        dims.build_mesh()
    except Exception as err:  # AssertionError from _validate, RuntimeError/ValueError from the mesh
        return {"error": f"{type(err).__name__}: {err}"}
    return {
        "sizes": {name: mesh.size() for name, mesh in dims._meshes.items()},
        "enabled": sorted(dims.get_all_one_dimensional_meshes()),
        "fsdp_enabled": dims.fsdp_enabled,
        "dp_replicate_enabled": dims.dp_replicate_enabled,
        "degrees": {k: getattr(dims, k) for k in ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep")},
    }


def _one_group_for_every_dimension() -> None:
    """Each mesh dimension's process groups are the world group instead of new ones: on the
    fake backend a group holds nothing of the layout (a mesh's sizes, names and slices come
    from its layout, not its groups), and creating them was two thirds of the probe's CPU
    (every rank's group of every dimension of every mesh: 66,000 new_group calls for 200
    layouts). Every answer was byte for byte the same with and without them over 1,782
    layouts, these tests' and their neighbours' (torch 2.13, torchtitan 0.2.2). Should a torch
    without this DeviceMesh method come, the groups are built again, only slower."""
    from torch.distributed.device_mesh import DeviceMesh

    if hasattr(DeviceMesh, "_init_one_process_group"):
        DeviceMesh._init_one_process_group = staticmethod(lambda *_: dist.group.WORLD.group_name)  # type: ignore[method-assign,assignment,union-attr]


def main() -> None:
    _package_without_init()
    from torchtitan.distributed import parallel_dims

    parallel_dims.device_type = "cpu"  # a fake process group needs no device; cuda would look for one
    _one_group_for_every_dimension()
    logging.disable(logging.INFO)  # build_mesh logs every mesh
    layouts = json.loads(sys.stdin.read())
    print("RESULT " + json.dumps([built(layout) for layout in layouts]), flush=True)


if __name__ == "__main__":
    main()
