"""A rank's exception as the pool is told it: one line, and when the model's own code raised
it, the traceback trimmed to the model's frames (the worker's and the standard library's
frames say nothing about the model; of torch's, only the innermost, where it failed).

Torch-free: the paths are compared as text.
"""

from __future__ import annotations

import sysconfig
import traceback
from pathlib import Path

_APP = str(Path(__file__).resolve().parents[2])  # the app package
_ZOO = str(Path(__file__).resolve().parents[1] / "zoo")  # example models: model code
_STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve())
_TORCH_PARTS = ("/torch/", "/torch\\")
# A traceback longer than this is cut at its start: the innermost frames are what matter.
MAX_CHARS = 4000


def _inside(filename: str, root: str) -> bool:
    try:
        return str(Path(filename).resolve()).startswith(root)
    except OSError:
        return False


def _is_worker(filename: str) -> bool:
    """The worker's own code; the example models that ship with it are model code."""
    return _inside(filename, _APP) and not _inside(filename, _ZOO)


def _is_torch(filename: str) -> bool:
    return any(part in filename for part in _TORCH_PARTS)


def model_frames(error: BaseException) -> list[traceback.FrameSummary]:
    """The frames of `error`'s traceback in the model's code (its own files and the libraries
    it calls, such as transformers), plus the innermost frame if that is torch's."""
    frames = traceback.extract_tb(error.__traceback__)
    kept = [
        f
        for f in frames
        if not _is_worker(f.filename) and not _inside(f.filename, _STDLIB) and not _is_torch(f.filename)
    ]
    if frames and _is_torch(frames[-1].filename):
        kept.append(frames[-1])
    return kept or frames[-3:]


def model_traceback(error: BaseException) -> str:
    """`error`'s traceback trimmed to the model's frames, in Python's own layout."""
    text = (
        "Traceback (the model's frames):\n"
        + "".join(traceback.format_list(model_frames(error)))
        + "".join(traceback.format_exception_only(type(error), error))
    ).rstrip("\n")
    return text if len(text) <= MAX_CHARS else "…" + text[-(MAX_CHARS - 1) :]
