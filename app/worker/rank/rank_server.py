"""A warm rank process: torch imported and DDP built once, then checks on demand.

Each process has its own pipe to the pool (a shared queue could hand two ranks of one check
to the same process, which would deadlock). The messages are those of
`contract.protocol`, the codec's JSON bytes on the pipe:

- `Join` to a node's leader: meet the other nodes, answer the assignment (`Joined`);
- `Run`: form a process group (or reuse the one kept from the last check on the same ranks,
  kept_group), run the check, keep the group or tear it down (`Result` or `Done`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import HashStore, PrefixStore, TCPStore
from torch.nn.parallel import DistributedDataParallel

from app.contract import protocol
from app.contract.host import BuiltModel
from app.contract.targets import FactoryError
from app.worker.checks.driver import run_spec
from app.worker.checks.result_parts import CheckGroup
from app.worker.rank import rendezvous
from app.worker.rank.backend import choose_backend
from app.worker.rank.kept_group import GroupLost, KeptGroup
from app.worker.rank.model_errors import model_traceback
from app.worker.training import mesh_models
from app.worker.training.synthetic_model import backward, batch_loss, build_model, synthetic_batch
from app.worker.training.token_model import sequence_length_of
from app.worker.training.workload import Registered, Workload, load, raised_by_model

PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>


def _exit_with_parent() -> None:
    """Die with the process that forked us (the pool's fork server, which exits with the
    app), even in the middle of a collective that holds the GIL: the kernel's parent-death
    signal where there is one, and a watching thread as well."""
    # Every fork holds the fork server's "alive" pipe, which keeps the fork server (our
    # parent) running as long as any fork lives; let go of it so that the fork server
    # exits with the app, and the parent-death signal below reaches us.
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver  # private: the fd has no public handle
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:
        with contextlib.suppress(OSError):
            os.close(alive)
        server._forkserver_alive_fd = None
    parent = os.getppid()
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent or not _is_fork_server(parent):
        # The parent went before the signal was armed (we were adopted by then): a rank that
        # outlived its fork server would outlive the app too.
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def _is_fork_server(pid: int) -> bool:
    """Whether `pid` runs multiprocessing's fork server (true where /proc cannot tell)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return b"multiprocessing.forkserver" in command


def _warm_up() -> None:
    """The first DDP construction and backward cost seconds; pay them before any check."""
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        model = DistributedDataParallel(build_model(0, torch.float64, torch.device("cpu")))
        x, y = synthetic_batch(torch.arange(4), 0, torch.float64, torch.device("cpu"))
        backward(batch_loss(model, x, y, "mean"))
    finally:
        dist.destroy_process_group()


def _host_info() -> protocol.HostInfo:
    cuda = torch.cuda.is_available()
    return protocol.HostInfo(
        torch_version=torch.__version__,
        cuda_available=cuda,
        gpus=torch.cuda.device_count() if cuda else 0,
        gpu_names=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        backends=[
            b
            for b, ok in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available() and cuda))
            if ok
        ],
    )


@functools.lru_cache(maxsize=4)
def _workload(name: str, target: str | None, seed: int, rank: int, world: int) -> Workload:
    """A factory's build, kept for the next check of the same model: a check trains a deep
    copy of the model, so the build is never changed. Keyed by rank and world as well,
    since a factory may build per rank."""
    return load(name, target, seed)


class RankServer:
    def __init__(self) -> None:
        self.store: TCPStore | None = None  # the leader's, from "join" to the end of "run"
        self.serving = False
        self.group = KeptGroup()

    def join(self, msg: protocol.Join) -> protocol.Joined:
        self.group.drop()  # a join forms a new group; the store it opens may be the kept one's port
        self.store, self.serving = rendezvous.open_store(msg.endpoint, msg.timeout_s, msg.nnodes)
        assignment = rendezvous.join(self.store, msg.run_id, msg.nnodes, msg.offered, msg.replicas)
        a = assignment
        return protocol.Joined(a.node_rank, a.nnodes, a.offset, a.world, a.local_count)

    def run(self, msg: protocol.Run) -> protocol.Result | protocol.Done:
        try:
            if msg.reuse:
                kept = self.group.take(msg.group)
                return self._run(msg, kept.store, kept.serving, formed=False)
            self.group.drop()
            if msg.leader and self.store is not None:
                store, serving = self.store, self.serving
            else:
                store, serving = rendezvous.join_store(msg.endpoint, msg.timeout_s), False
            return self._run(msg, store, serving, formed=True)
        finally:
            self.store, self.serving = None, False

    def _run(
        self, msg: protocol.Run, store: TCPStore, serving: bool, *, formed: bool
    ) -> protocol.Result | protocol.Done:
        spec = msg.spec
        run_id, rank, world = msg.run_id, msg.rank, msg.world
        if msg.local_index >= 0:
            backend, device = choose_backend(msg.backend, msg.local_processes, msg.local_index)
            if device.type == "cuda":
                torch.cuda.set_device(device)
            setup = 0.0  # a kept group: none formed
            if formed:
                started = time.perf_counter()
                dist.init_process_group(
                    backend,
                    store=PrefixStore(f"{run_id}/pg", store),
                    rank=rank,
                    world_size=world,
                    timeout=timedelta(seconds=msg.timeout_s),
                )
                setup = time.perf_counter() - started
            try:
                # Built once the group exists: a factory may ask for its rank.
                workload = _workload(spec.model, msg.model_target, spec.seed, rank, world)
                group = CheckGroup(rank, world, device, backend, msg.nnodes)
                check = run_spec(spec, group, workload, msg.model_target)
            except BaseException:
                self.group.drop()
                raise
            if msg.group:
                self.group.keep(msg.group, store, serving)
            else:
                self.group.drop()
            if check is not None:
                timed = check.with_setup_time(setup)
                if msg.nnodes == 1:  # rank 0 leads its own node: it answers itself
                    return protocol.Result(timed)
                rendezvous.publish_result(store, run_id, timed)
        if not msg.leader:
            return protocol.Done()
        return protocol.Result(rendezvous.collect_result(store, run_id, msg.nnodes, serving, msg.timeout_s))


def describe_models(models: dict[str, str]) -> dict[str, BuiltModel]:
    """Each registered model as its factory builds it, or why it cannot be built or trained
    (a smoke forward and backward on two samples)."""
    out: dict[str, BuiltModel] = {}
    for name, target in models.items():
        try:
            workload = Registered(name, target, 0)
        except FactoryError as err:
            out[name] = BuiltModel(name, loaded=False, error=str(err))
            continue
        try:
            workload.smoke_test()
            length = sequence_length_of(workload.dataset)  # what a tokens check compares
        except Exception as err:
            error = f"a forward and backward pass on two samples failed: {type(err).__name__}: {err}\n"
            out[name] = BuiltModel(name, loaded=False, error=error + model_traceback(err))
            continue
        described = workload.describe()
        out[name] = BuiltModel(
            name,
            loaded=True,
            description=described.description,
            parameters=described.parameters,
            dataset_size=described.dataset_size,
            sequence_length=length,
            model_class=described.model_class,
            sync_batch_norm=described.sync_batch_norm,
            # a tensor- or pipeline-parallel check needs it
            parallelize=mesh_models.registered_parallelize(target) is not None,
        )
    return out


def serve(conn: Connection, describe: dict[str, str] | None = None) -> None:
    _exit_with_parent()
    if "OMP_NUM_THREADS" not in os.environ:
        # As torchrun does for several ranks on one host: they share the cores, and a
        # thread pool per rank oversubscribes them (a tiny matmul took 10 ms with two
        # threads per rank here, 0.02 ms with one).
        torch.set_num_threads(1)
    _warm_up()
    conn.send_bytes(protocol.to_pipe(protocol.Ready(os.getpid(), _host_info())))
    if describe:
        # After "ready": a slow factory must not count against the warm-up deadline.
        conn.send_bytes(protocol.to_pipe(protocol.Models(describe_models(describe))))
    server = RankServer()
    while True:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            return
        reply: protocol.FromRank
        try:
            msg = protocol.from_pipe(raw)
            if isinstance(msg, protocol.Exit):
                return
            if isinstance(msg, protocol.Join):
                reply = server.join(msg)
            elif isinstance(msg, protocol.Run):
                reply = server.run(msg)
            else:
                raise ValueError(f"a rank does not take {msg.op!r} messages")
        except Exception as err:  # reported to the pool, which decides whether to keep this process
            by_model = raised_by_model(err)
            reply = protocol.Error(
                f"{type(err).__name__}: {err}",
                traceback=model_traceback(err) if by_model else None,
                model_raised=by_model,
                group_lost=isinstance(err, GroupLost),
            )
        conn.send_bytes(protocol.to_pipe(reply))
