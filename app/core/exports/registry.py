"""The export formats by name: one line per format. The web layer and the CLI list and look
formats up here; a new format is one module and one line below."""

from __future__ import annotations

import re

from app.core.errors import NotFound
from app.core.exports.accelerate import export_accelerate
from app.core.exports.common import Export, Exporter, ExportInput
from app.core.exports.deepspeed import export_deepspeed
from app.core.exports.hf_trainer import export_hf_trainer
from app.core.exports.kubernetes import export_kubernetes
from app.core.exports.lightning import export_lightning
from app.core.exports.megatron import export_megatron
from app.core.exports.python_skeleton import export_python
from app.core.exports.slurm import export_slurm
from app.core.exports.torchrun import export_torchrun
from app.core.exports.torchtitan import export_torchtitan

# The order is the order formats are listed in (404 details, OpenAPI examples, the CLI).
EXPORTERS: dict[str, Exporter] = {
    "torchrun": export_torchrun,
    "slurm": export_slurm,
    "kubernetes": export_kubernetes,
    "deepspeed": export_deepspeed,
    "accelerate": export_accelerate,
    "hf-trainer": export_hf_trainer,
    "lightning": export_lightning,
    "python": export_python,
    "torchtitan": export_torchtitan,
    "megatron": export_megatron,
}


def export(fmt: str, x: ExportInput) -> Export:
    """Raises KeyError for an unknown format (the web layer answers 404 with `EXPORTERS`)."""
    return EXPORTERS[fmt](x)


def unknown_format(fmt: str) -> NotFound:
    """The error for a name not in `EXPORTERS`, listing the known ones. The name is echoed
    back, so it is cut short and anything but name characters is masked."""
    shown = re.sub(r"[^A-Za-z0-9_.-]", "?", fmt[:40])
    return NotFound(f"unknown export format '{shown}'; known formats: {', '.join(EXPORTERS)}")
