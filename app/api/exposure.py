"""Whether a worker runs checks for anyone who can reach it: the addresses this process
listens on, read from the kernel (its own sockets in /proc/self/net/tcp and tcp6), against
whether an API key guards the worker's routes.

The app cannot ask uvicorn (or gunicorn, or `batchplan serve`) where it was bound, and binds
after the app's start-up; the kernel knows, whoever bound the socket. Elsewhere than Linux
nothing is read and nothing is said.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import sys
from pathlib import Path

from app.settings import Settings

log = logging.getLogger("batchplan")

LISTEN = "0A"  # the TCP state in /proc/net/tcp
# How long start-up waits for the server to bind before it says nothing.
BIND_WAIT_S = 30.0


def listening(proc: Path = Path("/proc/self")) -> list[str]:
    """host:port of every TCP socket this process listens on ([host]:port for IPv6)."""
    ours = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(proc / "fd"):
            with contextlib.suppress(OSError):  # closed meanwhile (the listing's own, for one)
                ours.add(os.readlink(proc / "fd" / fd))
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        with contextlib.suppress(OSError):
            for line in (proc / "net" / table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == LISTEN and f"socket:[{fields[9]}]" in ours:
                    found.append(_address(fields[1], family))
    return sorted(found)


def _address(field: str, family: int) -> str:
    """/proc/net/tcp's hex `address:port` (the address as 32-bit words in host order)."""
    hex_address, hex_port = field.split(":")
    raw = bytes.fromhex(hex_address)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    host = socket.inet_ntop(family, raw)
    return f"[{host}]:{int(hex_port, 16)}" if family == socket.AF_INET6 else f"{host}:{int(hex_port, 16)}"


def beyond_loopback(addresses: list[str]) -> list[str]:
    """The addresses other hosts may reach (0.0.0.0 and :: are every interface)."""
    out = []
    for address in addresses:
        ip = ipaddress.ip_address(address.rsplit(":", 1)[0].strip("[]"))
        mapped = getattr(ip, "ipv4_mapped", None)
        if not (ip.is_loopback or (mapped is not None and mapped.is_loopback)):
            out.append(address)
    return out


def exposure(settings: Settings, addresses: list[str] | None = None) -> dict[str, object]:
    """What /v1/host says: where the server listens, whether a key guards the worker, and a
    warning when a worker without a key listens beyond loopback."""
    addresses = listening() if addresses is None else addresses
    open_to = beyond_loopback(addresses)
    keyed = settings.api_key is not None
    warning = None
    if settings.worker_enabled and not keyed and open_to:
        warning = (
            f"the worker runs checks for anyone who can reach {', '.join(open_to)}: no API key is "
            "set; set BATCHPLAN_API_KEY (the worker's routes then require it), or bind to 127.0.0.1"
        )
    return {"listening": addresses, "api_key": keyed, "warning": warning}


async def warn_once_bound(settings: Settings) -> None:
    """At start-up: once the server listens, log the warning if there is one."""
    waited = 0.0
    while not (addresses := listening()) and waited < BIND_WAIT_S:
        await asyncio.sleep(0.1)
        waited += 0.1
    warning = exposure(settings, addresses)["warning"]
    if warning:
        log.warning("%s", warning)
