"""What the two python skeletons (plain DDP, python_skeleton, and the device mesh,
python_mesh_skeleton) write alike: the start of main() that starts the process group and picks
each rank's device, its end that tears the groups down, and the filling of a skeleton's
placeholders."""

from __future__ import annotations

from app.core.exports.parts.common import summary, uniform_gpus_per_node
from app.core.exports.parts.export_types import Export, ExportInput

# In main(), after the script's own --checkpoint option.
_PROCESS_GROUP = """
    parser.add_argument("--checkpoint-every", type=int, default=100, help="optimizer steps; 0: never")
    args = parser.parse_args()

    backend = "nccl" if torch.cuda.is_available() and not TOY else "gloo"
    dist.init_process_group(backend)""".strip("\n")

_DEVICE = """
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)""".strip("\n")


# The end of main(); __FREED__ names what the skeleton built that holds the process groups.
_TEARDOWN = """
    # DDP's reducer and FSDP's modules hold the process groups and their last work objects, in
    # reference cycles; left to interpreter shutdown, gloo's threads free tensors after Python
    # is gone and the rank aborts with "terminate called without an active exception". Free them
    # while Python is alive (hence the collect), then let every rank arrive before any tears the
    # groups down.
    del __FREED__
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()""".strip("\n")


def render_skeleton(skeleton: str, x: ExportInput, fields: dict[str, str]) -> Export:
    """The `python` export: `skeleton` with the shared placeholders filled, then `fields`, in order."""
    shape = uniform_gpus_per_node(x)
    shared = {
        "__PROCESS_GROUP__": _PROCESS_GROUP,
        "__DEVICE__": _DEVICE,
        "__TEARDOWN__": _TEARDOWN,
        "__SUMMARY__": "\n".join(summary(x)).replace('"""', "'''").replace("\\", "\\\\"),
        "__NPROC__": str(shape if shape is not None else "gpu"),
        "__SCRIPT__": x.options.script,
    }
    text = skeleton
    for token, value in {**shared, **fields}.items():
        text = text.replace(token, value)
    return Export("python", "text/plain", "train.py", text)
