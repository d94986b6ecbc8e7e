"""Every check kind, in the order the driver tries them within its stage (kind.STAGES): the
first `step` kind that applies runs the plan's first step, the first `run` kind that applies
trains the run after it, then every `after` kind that applies runs on the same ranks. A kind
earlier in its stage is the more particular: it applies to specs the later ones would also
take. A new kind is a module (or a folder) of its own and one line here."""

from __future__ import annotations

from typing import Any

from app.worker.checks.ddp_check import DdpStep
from app.worker.checks.kind import CheckKind
from app.worker.checks.lr_scaling.probe import LrScalingProbe
from app.worker.checks.mesh.check import MeshStep
from app.worker.checks.packed_check import PackedTokenStep
from app.worker.checks.resume.check import ResumeRun
from app.worker.checks.run.check import DdpRun
from app.worker.checks.run.mesh import MeshRun
from app.worker.checks.stream_check import StreamStep
from app.worker.checks.throughput_check import ThroughputMeasure
from app.worker.checks.token_check import TokenStep

KINDS: tuple[CheckKind[Any], ...] = (
    StreamStep(),  # step: a stream plan's epoch,
    MeshStep(),  # the plan's mesh,
    PackedTokenStep(),  # the tokens workload on a packed plan,
    TokenStep(),  # the tokens workload,
    DdpStep(),  # else DDP replicas
    ResumeRun(),  # run: a resumed run,
    MeshRun(),  # a run on the plan's mesh,
    DdpRun(),  # else a run on DDP replicas
    ThroughputMeasure(),  # after: each that applies
    LrScalingProbe(),
)
