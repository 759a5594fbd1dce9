"""A whole timeshare stack on this machine for integration tests: the
Temporal dev server, the scheduler, the gateway and one sim agent per node,
each a process of its own, as `timeshare up` runs them. A test starts it,
points its jobs at it, can kill and restart any part, and reads the sim
backend's record to check that no two jobs ever held a simulated GPU at once.

    from timeshare.testing import LocalStack, overlaps

    with LocalStack(tmp_path) as stack:
        with timeshare.connect(stack.address) as client:
            job = client.join("my-group", "my-job", [stack.node])
            ...
        assert overlaps(stack.record()) == 0

It needs the server extra (`pip install 'timeshare[server]'`): the parts run
as `python -m timeshare ...` with this interpreter. The project's own tests and
benchmarks run on it (docs/guide/testing.md)."""

from timeshare.self_command import timeshare_command
from timeshare.testing.ports import free_port
from timeshare.testing.residency import overlaps
from timeshare.testing.stack import LocalStack, temporal_only, wait_gone

__all__ = ["LocalStack", "free_port", "overlaps", "temporal_only", "timeshare_command", "wait_gone"]
