"""The messages between the pool and its warm ranks, one small dataclass each.

On the pipe every message is a plain dict with an "op" key (what `to_dict` writes and
`from_dict` reads), so both ends stay picklable and free of each other's classes; the spec
and the result inside are typed on both ends and JSON on the pipe. Torch-free: the web
process imports this.

Pool to rank: `Join` (to a node's leader: meet the other nodes), `Run`, `Exit`.
Rank to pool: `Ready` once warm, `Models` (what the registered models build), `Joined`,
`Done` (a rank that is not the leader), `Result` (the leader), `Error`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from app.contract.check_result import CheckResult
from app.contract.spec import CheckSpec


@dataclass(frozen=True, slots=True)
class _Message:
    op: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}


@dataclass(frozen=True, slots=True)
class Join(_Message):
    op: ClassVar[str] = "join"
    endpoint: str
    run_id: str
    nnodes: int
    timeout_s: float
    offered: int  # this node's processes
    replicas: int  # the check's data-parallel replicas


@dataclass(frozen=True, slots=True)
class Joined(_Message):
    """The node's place in the check (rendezvous.Assignment)."""

    op: ClassVar[str] = "joined"
    node_rank: int
    nnodes: int
    offset: int
    world: int
    local_count: int


@dataclass(frozen=True, slots=True)
class Run(_Message):
    op: ClassVar[str] = "run"
    endpoint: str
    run_id: str
    nnodes: int
    timeout_s: float
    spec: CheckSpec
    world: int
    backend: str
    local_processes: int
    # The registered model's package.module:factory, resolved by the service from its own
    # registry: a request names a model, never an import path.
    model_target: str | None
    rank: int
    local_index: int  # -1: this process sits the check out
    leader: bool
    # The name under which the ranks keep the check's process group for the next check on the
    # same ranks ("": tear it down after), and whether every rank already holds it (no
    # rendezvous then: the endpoint is unused).
    group: str = ""
    reuse: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {**_Message.to_dict(self), "spec": self.spec.to_json()}


@dataclass(frozen=True, slots=True)
class Exit(_Message):
    op: ClassVar[str] = "exit"


@dataclass(frozen=True, slots=True)
class HostInfo:
    """What a warm rank reports about its host."""

    torch_version: str | None = None
    cuda_available: bool | None = None
    gpus: int | None = None
    gpu_names: list[str] = field(default_factory=list)
    backends: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Ready(_Message):
    op: ClassVar[str] = "ready"
    pid: int
    host: HostInfo

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "pid": self.pid, **dataclasses.asdict(self.host)}


@dataclass(frozen=True, slots=True)
class Models(_Message):
    op: ClassVar[str] = "models"
    models: dict[str, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Done(_Message):
    op: ClassVar[str] = "done"


@dataclass(frozen=True, slots=True)
class Result(_Message):
    op: ClassVar[str] = "result"
    result: CheckResult

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "result": self.result.to_json()}


@dataclass(frozen=True, slots=True)
class Error(_Message):
    op: ClassVar[str] = "error"
    error: str
    # When the model's own code raised: its traceback, trimmed to the model's frames.
    traceback: str | None = None
    model_raised: bool = False
    # The pool named a kept process group this rank does not hold (rank.kept_group.GroupLost).
    group_lost: bool = False


ToRank = Join | Run | Exit
FromRank = Ready | Models | Joined | Done | Result | Error
Message = ToRank | FromRank

_PLAIN: dict[str, type[Join | Exit | Models | Joined | Done | Error]] = {
    cls.op: cls for cls in (Join, Exit, Models, Joined, Done, Error)
}


def from_dict(data: dict[str, Any]) -> Message:
    op = data.get("op")
    fields = {k: v for k, v in data.items() if k != "op"}
    if op == Ready.op:
        host = {f.name for f in dataclasses.fields(HostInfo)}
        return Ready(pid=data["pid"], host=HostInfo(**{k: v for k, v in data.items() if k in host}))
    if op == Run.op:
        return Run(**{**fields, "spec": CheckSpec.from_json(data["spec"])})
    if op == Result.op:
        return Result(CheckResult.from_json(data["result"]))
    cls = _PLAIN.get(str(op))
    if cls is None:
        raise ValueError(f"unknown message op {op!r}")
    return cls(**fields)
