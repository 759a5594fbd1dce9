"""A job leaves its group when the process that takes its turns ends, so
that its lease is never what frees the GPUs: at a normal exit and on an
uncaught exception (both reach ``atexit``), and on SIGTERM.

SIGTERM is caught only where nothing else handles it (its action is still
the default, which kills the process without running ``atexit``): the
handler leaves, then lets the signal kill the process as it would have.
Where a framework already handles it (Ray turns it into ``SystemExit``, so
``atexit`` runs), that handler is left alone. SIGKILL cannot be caught:
such a job is freed by its lease, or by the node agents once its registered
processes are gone and a switch asks for them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

_closers: list[Callable[[], None]] = []
_guard = threading.Lock()
_installed = False


def leave_at_exit(close: Callable[[], None]) -> None:
    """Call ``close`` (a Turns' close: give the turn back, leave the group)
    when this process exits, crashes or is sent SIGTERM."""
    global _installed
    atexit.register(close)
    with _guard:
        _closers.append(close)
        if _installed or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return  # someone handles it (Ray: SystemExit, so atexit runs)
        signal.signal(signal.SIGTERM, _on_sigterm)
        _installed = True


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    with _guard:
        closers = list(_closers)
    for close in closers:
        # Leaving is best effort here: the process dies next whatever happens.
        with contextlib.suppress(Exception):
            close()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
