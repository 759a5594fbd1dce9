"""Free TCP ports on loopback for the servers of a local stack."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Servers' ports are drawn from below the kernel's ephemeral range, where
# every outgoing connection (each client of Temporal) takes its source port:
# a port found free there stays free until the server binds it, even with
# several stacks starting at once (the test suite's processes).
PORTS_BELOW_EPHEMERAL = 12000
_ports = random.Random()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    low = _ephemeral_low()
    for _ in range(200):
        port = _ports.randrange(max(1024, low - PORTS_BELOW_EPHEMERAL), low)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        chosen: int = probe.getsockname()[1]
        return chosen
