"""Every check kind, in the order the driver tries them: the first `step` kind that applies
runs the plan's first step, then every `after` kind that applies runs on the same ranks.
A new kind is a module of its own and one line here."""

from __future__ import annotations

from typing import Any

from app.worker.checks.ddp_check import DdpStep
from app.worker.checks.kind import CheckKind
from app.worker.checks.lr_scaling_probe import LrScalingProbe
from app.worker.checks.mesh_check import MeshStep
from app.worker.checks.mesh_run import MeshRun
from app.worker.checks.resume_check import ResumeRun
from app.worker.checks.run_check import DdpRun
from app.worker.checks.throughput_check import ThroughputMeasure
from app.worker.checks.token_check import TokenStep

KINDS: tuple[CheckKind[Any], ...] = (
    MeshStep(),
    TokenStep(),
    DdpStep(),
    DdpRun(),
    MeshRun(),
    ResumeRun(),
    ThroughputMeasure(),
    LrScalingProbe(),
)
