"""Every kind's part of building a spec, in the order `request.build_spec` runs them: a run
before its resume (which goes on from it), then the kinds that follow the check. A new kind
is a module of its own and one line here."""

from __future__ import annotations

from app.contract.kinds.lr_scaling import LrScalingPart
from app.contract.kinds.part import RequestPart
from app.contract.kinds.resume import ResumePart
from app.contract.kinds.run import RunPart
from app.contract.kinds.stream import StreamPart
from app.contract.kinds.throughput import ThroughputPart

REQUEST_PARTS: tuple[RequestPart, ...] = (
    RunPart(),
    ResumePart(),
    ThroughputPart(),
    LrScalingPart(),
    StreamPart(),
)
