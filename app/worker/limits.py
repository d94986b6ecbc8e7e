"""What this worker accepts: its limits, taken from the settings in one place."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.core.errors import InvalidValue

if TYPE_CHECKING:
    from app.settings import Settings


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
        return cls(
            max_replicas_per_check=settings.max_replicas_per_check,
            processes_per_host=settings.processes_per_host,
            queue_size=settings.queue_size,
            check_timeout_s=settings.check_timeout_s,
            concurrent_checks=settings.concurrent_checks,
            max_check_samples=settings.max_check_samples,
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
