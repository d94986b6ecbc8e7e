"""What the two python skeletons (plain DDP, python_skeleton, and the device mesh,
python_mesh_skeleton) write alike: the start of main() that starts the process group and picks
each rank's device, and the filling of a skeleton's placeholders."""

from __future__ import annotations

from app.core.exports.common import Export, ExportInput, summary, uniform_gpus_per_node

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


def render_skeleton(skeleton: str, x: ExportInput, fields: dict[str, str]) -> Export:
    """The `python` export: `skeleton` with the shared placeholders filled, then `fields`, in order."""
    shape = uniform_gpus_per_node(x)
    shared = {
        "__PROCESS_GROUP__": _PROCESS_GROUP,
        "__DEVICE__": _DEVICE,
        "__SUMMARY__": "\n".join(summary(x)).replace('"""', "'''").replace("\\", "\\\\"),
        "__NPROC__": str(shape if shape is not None else "gpu"),
        "__SCRIPT__": x.options.script,
    }
    text = skeleton
    for token, value in {**shared, **fields}.items():
        text = text.replace(token, value)
    return Export("python", "text/plain", "train.py", text)
