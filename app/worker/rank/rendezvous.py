"""How the warm ranks of one or more hosts form one check.

Every node's leader rank meets the others in a TCPStore at the rendezvous endpoint (the
first node on the endpoint's host serves it, like torchrun's c10d backend), takes a node
rank in arrival order, and publishes how many processes it offers. All nodes then derive
the same global ranks. A check on one host is the same with one node and a local endpoint.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from datetime import timedelta

from torch._C._distributed_c10d import TCPStore

from app.contract.check_result import CheckResult
from app.contract.codec import from_json, to_json


@dataclass(frozen=True, slots=True)
class Assignment:
    node_rank: int
    nnodes: int
    offset: int  # global rank of this node's first process
    world: int  # processes in the check, all nodes
    local_count: int  # processes of this node that take part


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def is_local_host(host: str) -> bool:
    """Binding to an address succeeds only where a local interface owns it."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, address in infos:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address[0], 0))
                return True
            except OSError:
                continue
    return False


def open_store(endpoint: str, timeout_s: float, nnodes: int = 2) -> tuple[TCPStore, bool]:
    """Serve the store if the endpoint is ours and the port is free, else join it. A check on
    one node serves its own: a port that is taken there is another program's (a client would
    ping it until the timeout), or another check's."""
    host, port = split_endpoint(endpoint)
    timeout = timedelta(seconds=timeout_s)
    if is_local_host(host):
        try:
            return TCPStore(host, port, is_master=True, timeout=timeout, wait_for_workers=False), True
        except (RuntimeError, OSError) as err:
            if nnodes == 1:
                raise RuntimeError(
                    f"the rendezvous endpoint {endpoint} is in use: a check on one node serves its "
                    "own store there; name a free port, or leave rendezvous out"
                ) from err
            # else another node on this host serves it
    return TCPStore(host, port, is_master=False, timeout=timeout), False


def join_store(endpoint: str, timeout_s: float) -> TCPStore:
    host, port = split_endpoint(endpoint)
    return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))


def assign(counts: list[int], node_rank: int, replicas: int) -> Assignment:
    """Global ranks in node order; processes past the replica count sit the check out."""
    offset = sum(counts[:node_rank])
    world = min(sum(counts), replicas)
    local = max(0, min(counts[node_rank], world - offset))
    return Assignment(node_rank, len(counts), min(offset, world), world, local)


def join(store: TCPStore, run_id: str, nnodes: int, offered: int, replicas: int) -> Assignment:
    node_rank = store.add(f"{run_id}/nodes", 1) - 1
    if node_rank >= nnodes:
        raise RuntimeError(f"more than nnodes={nnodes} nodes joined run {run_id!r}")
    store.set(f"{run_id}/offer/{node_rank}", str(offered))
    keys = [f"{run_id}/offer/{i}" for i in range(nnodes)]
    store.wait(keys)
    counts = [int(store.get(k)) for k in keys]
    return assign(counts, node_rank, replicas)


def publish_result(store: TCPStore, run_id: str, result: CheckResult) -> None:
    """Rank 0's result for every node's leader (a check across hosts; on one host rank 0 is the
    leader and answers itself)."""
    store.set(f"{run_id}/result", to_json(result).decode())  # ASCII; the stub takes str only


def collect_result(store: TCPStore, run_id: str, nnodes: int, serving: bool, timeout_s: float) -> CheckResult:
    """Every node reports rank 0's result; the node serving the store waits for the others
    to read it before the store goes away."""
    result: CheckResult = from_json(CheckResult, store.get(f"{run_id}/result"))
    store.add(f"{run_id}/done", 1)
    deadline = time.monotonic() + timeout_s
    while serving and store.add(f"{run_id}/done", 0) < nnodes and time.monotonic() < deadline:
        time.sleep(0.005)
    if serving:  # a kept group's store serves the next checks too
        for key in (f"{run_id}/result", f"{run_id}/done"):
            store.delete_key(key)
    return result
