"""SIGTERM (``kill``, ``scancel``, a scheduler's preemption) stopping a command as Ctrl-C does.

A background job started by a non-interactive shell ignores SIGINT, and batch schedulers stop
jobs with SIGTERM; a sweep, a plan and ``lengthgen eval`` should stop as cleanly then as after
Ctrl-C (exit code 143 instead of 130).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["SweepTerminated", "sigterm_stops_cleanly"]


class SweepTerminated(KeyboardInterrupt):
    """SIGTERM taking the Ctrl-C path."""


@contextmanager
def sigterm_stops_cleanly() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`SweepTerminated` (main thread only)."""

    def handler(signum: int, frame: object) -> None:
        raise SweepTerminated()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
