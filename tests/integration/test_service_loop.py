"""The suite's shared services (scheduler worker, gateway, sim agents) run on
a loop of their own (tests/service_loop.py): a test that blocks pytest's
event loop does not pause them for every other test's groups."""

from __future__ import annotations

import threading

import timeshare
from tests.conftest import SimNodes


async def test_the_services_serve_while_a_test_blocks_pytests_loop(
    gateway: str, sim_nodes: SimNodes, unique: str
) -> None:
    node = f"n-{unique}"
    await sim_nodes.start(node)
    finished, errors = threading.Event(), []

    def take_turns() -> None:
        try:
            with timeshare.connect(gateway) as client:
                job = client.join(f"g-{unique}", "a", nodes=[node])
                for _ in range(3):
                    with job.turn(timeout=60):
                        pass
                job.leave()
        except Exception as error:
            errors.append(error)
        finally:
            finished.set()

    # Daemonic: where the services do run on pytest's loop, the turns finish
    # only after this test has failed and given the loop back.
    threading.Thread(target=take_turns, daemon=True).start()
    # A blocking wait on pytest's loop, as a synchronous test makes: nothing on
    # this loop runs until the turns are done.
    done = finished.wait(60)
    assert done, "the turns waited for pytest's loop: the services run on it"
    assert not errors, errors
