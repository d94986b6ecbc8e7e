"""One check on the warm ranks the pool gave it: the node's leader meets the other nodes (if
any) at the rendezvous, every rank that takes part runs its share of the replicas, and rank
0's result comes back, typed, with this node's place in the check."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

from app.contract import protocol
from app.contract.check_result import CheckResult
from app.contract.mesh_spec import mesh_world
from app.contract.spec import CheckSpec
from app.ports import free_port
from app.worker.service.rank_process import RankProcess
from app.worker.service.runner import CheckOrder, RankError

# After a rank reports that the model raised, how long the check's other ranks have to
# report too (each then has left the check and torn its process group down) for all of them
# to be kept warm; one that does not is stuck, and every rank is replaced.
MODEL_ERROR_GRACE_S = 5.0

# A rank told to reuse a kept group it no longer holds answers at once (group_lost), and its
# peers then fail in their first collective: when a peer's error comes first, how long the
# other ranks have to say that their group was lost, which is the check's real cause (the
# pool then runs it again on fresh ranks).
GROUP_LOST_GRACE_S = 1.0

# The ranks' own rendezvous and collective timeouts outlast the check's timeout_s by this
# much: the service's deadline is the one that ends a check, in its own words ("did not
# finish within timeout_s"), not a rank's store timeout that fires at the same instant.
RANKS_OUTLAST_S = 5.0


def ranks_for(spec: CheckSpec, pool_size: int) -> tuple[int, int]:
    """How many warm ranks the check takes on this node, and how many replicas they run: a
    rank per replica up to the pool's size (a rank then runs several), but every mesh rank is
    a real process (admission holds the mesh within the pool)."""
    if spec.mesh is not None:
        world = mesh_world(spec.mesh)
        return world, world
    return min(spec.data_parallel_size, pool_size), spec.data_parallel_size


def backend_for(requested: str, gpus: int, ranks: list[RankProcess]) -> tuple[str, list[RankProcess]]:
    """The process group's backend and the ranks that run: NCCL when asked, or under auto when
    every rank gets a GPU, on at most one rank per GPU; gloo on all of them otherwise."""
    if requested == "nccl" or (requested == "auto" and gpus >= len(ranks)):
        return "nccl", ranks[: min(len(ranks), gpus)]
    return "gloo", ranks


async def _replies(tasks: list[asyncio.Task[protocol.FromRank]]) -> list[protocol.FromRank]:
    """Every rank's reply, or the first failure (a lost group before the failures it causes).
    When that failure is the model's own exception and every other rank answers within the
    grace, each with a reply or the model's exception too, the error says the ranks can be
    kept (`ranks_kept`)."""
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = [e for t in tasks if t in done and (e := t.exception()) is not None]
        if not failed:
            return [t.result() for t in tasks]
        first = _cause(failed)
        if isinstance(first, RankError) and not (first.group_lost or first.model_raised) and pending:
            _, pending = await asyncio.wait(pending, timeout=GROUP_LOST_GRACE_S)
            first = _cause([e for t in tasks if t.done() and (e := t.exception()) is not None])
        if isinstance(first, RankError) and first.model_raised and pending:
            _, pending = await asyncio.wait(pending, timeout=MODEL_ERROR_GRACE_S)
        if isinstance(first, RankError):
            errors = [t.exception() for t in tasks if t.done() and not t.cancelled()]
            clean = all(e is None or (isinstance(e, RankError) and e.model_raised) for e in errors)
            if clean and not pending:
                raise first.kept()
        raise first
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _cause(errors: list[BaseException]) -> BaseException:
    """The error that explains the others: a rank's lost group (its peers' failures follow
    from it), else the first in rank order."""
    return next((e for e in errors if isinstance(e, RankError) and e.group_lost), errors[0])


def _kept_group(ranks: list[RankProcess], backend: str, timeout_s: float) -> tuple[str, bool]:
    """The process group this check keeps for the next one on the same ranks, and whether
    every rank already holds it, formed by these ranks in this order with this backend and
    timeout (rank.kept_group says why)."""
    held = {rank.group for rank in ranks}
    kept = held.pop() if len(held) == 1 else None
    if (
        kept is not None
        and kept[1:] == (len(ranks), backend, timeout_s)
        and all(rank.group_rank == i for i, rank in enumerate(ranks))
    ):
        return kept[0], True
    return uuid.uuid4().hex, False


async def run_on_ranks(
    ranks: list[RankProcess], order: CheckOrder, *, backend: str, replicas: int
) -> CheckResult:
    """Run `order` on `ranks` (this node's); raises RankError (with `ranks_kept`) or RankDied."""
    rendezvous = order.rendezvous
    timeout_s = order.timeout_s + RANKS_OUTLAST_S
    if rendezvous is None:  # this host alone: the ranks keep their group for the next check
        ranks = ranks[: min(len(ranks), replicas)]
        group, reuse = _kept_group(ranks, backend, timeout_s)
    else:
        group, reuse = "", False
    for rank in ranks:
        rank.group = None  # until this check has succeeded on it
    if reuse:
        joined = protocol.Joined(node_rank=0, nnodes=1, offset=0, world=len(ranks), local_count=len(ranks))
        endpoint, run_id = "", order.job_id
    else:
        endpoint = rendezvous.endpoint if rendezvous else f"127.0.0.1:{free_port()}"
        run_id = rendezvous.run_id if rendezvous else order.job_id
        nnodes = rendezvous.nnodes if rendezvous else 1
        join = protocol.Join(endpoint, run_id, nnodes, timeout_s, offered=len(ranks), replicas=replicas)
        joined = await ranks[0].request(join, protocol.Joined)
    count = joined.local_count
    tasks = [
        asyncio.create_task(
            rank.request(
                protocol.Run(
                    endpoint,
                    run_id,
                    joined.nnodes,
                    timeout_s,
                    spec=order.spec,
                    world=joined.world,
                    backend=backend,
                    local_processes=count,
                    model_target=order.model_target,
                    rank=joined.offset + i,
                    local_index=i if i < count else -1,
                    leader=i == 0,
                    group=group,
                    reuse=reuse,
                ),
                protocol.Result if i == 0 else protocol.Done,
            )
        )
        for i, rank in enumerate(ranks[: max(count, 1)])
    ]
    leader = (await _replies(tasks))[0]
    assert isinstance(leader, protocol.Result)
    if group:
        for i, rank in enumerate(ranks):
            rank.group, rank.group_rank = (group, len(ranks), backend, timeout_s), i
    return dataclasses.replace(leader.result, node_rank=joined.node_rank)
