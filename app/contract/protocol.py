"""The messages between the pool and its warm ranks, one small record each.

On the pipe every message is the codec's JSON bytes of it (its "op" first), sent and read as
bytes (`Connection.send_bytes` / `recv_bytes`: nothing pickled on top), so both ends stay free
of each other's classes; the spec and the result inside are typed at both ends. Torch-free:
the web process imports this.

Pool to rank: `Join` (to a node's leader: meet the other nodes), `Run`, `Exit`.
Rank to pool: `Ready` once warm, `Models` (what the registered models build), `Joined`,
`Done` (a rank that is not the leader), `Result` (the leader), `Error`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from app.contract.check_result import CheckResult
from app.contract.codec import from_json, to_json
from app.contract.host import BuiltModel
from app.contract.spec import CheckSpec


@dataclass(frozen=True, slots=True)
class _Message:
    # The codec's tag for the record, named in the class line: `class Run(_Message, op="run")`.
    op: ClassVar[str]

    # No super() call: slots=True makes this class again, so the zero-argument form's cell
    # names the old one; object's hook does nothing.
    def __init_subclass__(cls, op: str | None = None) -> None:
        if op is not None:  # dataclass(slots=True) makes the class again, without the keyword
            cls.op = op


@dataclass(frozen=True, slots=True)
class Join(_Message, op="join"):
    endpoint: str
    run_id: str
    nnodes: int
    timeout_s: float
    offered: int  # this node's processes
    replicas: int  # the check's data-parallel replicas


@dataclass(frozen=True, slots=True)
class Joined(_Message, op="joined"):
    """The node's place in the check (rendezvous.Assignment)."""

    node_rank: int
    nnodes: int
    offset: int
    world: int
    local_count: int


@dataclass(frozen=True, slots=True)
class Run(_Message, op="run"):
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


@dataclass(frozen=True, slots=True)
class Exit(_Message, op="exit"):
    """Leave: the rank process ends."""


@dataclass(frozen=True, slots=True)
class HostInfo:
    """What a warm rank reports about its host."""

    torch_version: str | None = None
    cuda_available: bool | None = None
    gpus: int | None = None
    gpu_names: list[str] = field(default_factory=list)
    backends: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Ready(_Message, op="ready"):
    pid: int
    host: HostInfo


@dataclass(frozen=True, slots=True)
class Models(_Message, op="models"):
    models: dict[str, BuiltModel]


@dataclass(frozen=True, slots=True)
class Done(_Message, op="done"):
    """A rank that is not the leader finished its part of the check."""


@dataclass(frozen=True, slots=True)
class Result(_Message, op="result"):
    result: CheckResult


@dataclass(frozen=True, slots=True)
class Error(_Message, op="error"):
    error: str
    # When the model's own code raised: its traceback, trimmed to the model's frames.
    traceback: str | None = None
    model_raised: bool = False
    # The pool named a kept process group this rank does not hold (rank.kept_group.GroupLost).
    group_lost: bool = False


ToRank = Join | Run | Exit
FromRank = Ready | Models | Joined | Done | Result | Error
Message = ToRank | FromRank


def to_pipe(message: Message) -> bytes:
    return to_json(message)


def from_pipe(data: bytes) -> Message:
    message: Message = from_json(Message, data)
    return message
