"""A local stack whose drawn ports were taken before its parts bound them
(another stack of the suite starting at the same moment) starts on ports
drawn again, instead of failing its test."""

from __future__ import annotations

import socket
from pathlib import Path

import timeshare
from timeshare.testing import LocalStack
from timeshare.testing.ports import free_port


def test_a_stack_whose_ports_were_taken_starts_on_others(tmp_path: Path) -> None:
    taken = [free_port(), free_port()]
    holders = []
    for port in taken:
        holder = socket.socket()
        holder.bind(("127.0.0.1", port))
        holder.listen()
        holders.append(holder)
    try:
        with LocalStack(tmp_path, temporal_port=taken[0], gateway_port=taken[1]) as stack:
            assert stack.temporal_port != taken[0] and stack.gateway_port != taken[1]
            with timeshare.connect(stack.address) as client:
                assert client.list_groups() == []
    finally:
        for holder in holders:
            holder.close()
