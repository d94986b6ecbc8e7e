"""What this worker accepts: its limits, taken from the settings in one place."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.errors.domain import InvalidValue

if TYPE_CHECKING:
    from app.settings import Settings

# Ranks on a host without GPUs (gloo on CPU): a few emulate any data-parallel size; more cost
# memory and start-up time, not accuracy.
CPU_PROCESSES_PER_HOST = 4
MAX_PROCESSES_PER_HOST = 64  # the setting's own bound


def visible_gpus(environ: Mapping[str, str] = os.environ, dev: Path = Path("/dev")) -> int:
    """The CUDA devices this process would see, counted without importing torch (the web
    process never does, and the planner-only image has none).

    The driver makes one /dev/nvidiaN node per GPU, and the NVIDIA container toolkit mounts
    only the container's own; CUDA_VISIBLE_DEVICES then narrows them as CUDA does: its entries
    up to the first that is not a device (so "" and "-1" hide every GPU). One MIG instance
    counts as its whole GPU here unless CUDA_VISIBLE_DEVICES names the instances.
    """
    try:
        nodes = sum(1 for name in os.listdir(dev) if re.fullmatch(r"nvidia\d+", name))
    except OSError:
        nodes = 0
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None or nodes == 0:
        return nodes
    count = 0
    for entry in (e.strip() for e in listed.split(",")):
        uuid = entry.startswith(("GPU-", "MIG-"))
        if not (uuid or (entry.isdigit() and int(entry) < nodes)):
            break
        count += 1
    return count


def default_processes_per_host() -> int:
    """`auto`: one rank per visible GPU, so a check uses the whole host; a few without GPUs."""
    return min(visible_gpus(), MAX_PROCESSES_PER_HOST) or CPU_PROCESSES_PER_HOST


@dataclass(frozen=True, slots=True)
class Limits:
    max_replicas_per_check: int
    processes_per_host: int
    queue_size: int
    check_timeout_s: float
    concurrent_checks: int
    # A rank holds the global batch in memory (its samples, their indices and weights); the
    # dataset it only indexes, whatever its size.
    max_check_samples: int = 1 << 20
    # A shuffled dataset's order is torch.randperm(num_samples), 8 bytes a sample on each
    # rank (512 MiB here): the one cost that grows with the dataset. Unshuffled: no limit.
    max_shuffled_samples: int = 1 << 26
    # Hosts a rendezvous endpoint may name; empty: this host's own names and loopback.
    rendezvous_hosts: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        processes = settings.processes_per_host
        return cls(
            max_replicas_per_check=settings.max_replicas_per_check,
            processes_per_host=default_processes_per_host() if processes == "auto" else processes,
            queue_size=settings.queue_size,
            check_timeout_s=settings.check_timeout_s,
            concurrent_checks=settings.concurrent_checks,
            max_check_samples=settings.max_check_samples,
            max_shuffled_samples=settings.max_shuffled_samples,
            rendezvous_hosts=tuple(settings.rendezvous_hosts),
        )

    def allowed_rendezvous_hosts(self) -> set[str]:
        if self.rendezvous_hosts:
            return {h.lower() for h in self.rendezvous_hosts}
        names = {"127.0.0.1", "::1", "localhost", socket.gethostname().lower(), socket.getfqdn().lower()}
        return names

    def check_rendezvous_endpoint(self, endpoint: str) -> None:
        """The worker connects to (or serves) the endpoint: only hosts the operator named.
        (Not rendezvous.split_endpoint: that module imports torch, this one runs in the web
        process.)"""
        host = endpoint.rsplit(":", 1)[0].strip("[]").lower()
        allowed = self.allowed_rendezvous_hosts()
        if host not in allowed:
            raise InvalidValue(
                f"rendezvous host {host!r} is not one this worker may join; allowed: "
                f"{', '.join(sorted(allowed))} (set BATCHPLAN_RENDEZVOUS_HOSTS)",
                pointer="/rendezvous/endpoint",
            )
