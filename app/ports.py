"""A free local TCP port, for a rendezvous or a server a test or benchmark starts."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    # The port is free when the probe closes; a caller that binds it later can still lose a race
    # with another process, which is why callers bind soon after.
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port
