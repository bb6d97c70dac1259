"""SIGTERM and SIGHUP stop a run the way Ctrl-C does (``psctl launch``, ``psctl resume``).

Python ends a process at SIGTERM and SIGHUP at once, before any ``finally``: the launcher's
roles then died with it (they ask the kernel to), no summary was printed, and the run was left
``running``, later ``crashed``. Turned into ``KeyboardInterrupt`` here, the two go the way of
Ctrl-C: the coordinator is asked to stop, the run is recorded as ``interrupted``, every role is
stopped, and the summary says how to go on. The command then exits as a shell reports a process
a signal ended: 128 plus the signal's number (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

from psctl import settings

# kill's default, and the terminal's when it closes.
STOPPING = (signal.SIGTERM, signal.SIGHUP)


class Interruption:
    """The first stopping signal that came, if any."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal = signum
        raise KeyboardInterrupt

    @property
    def exit_code(self) -> int:
        """An interrupted command's exit code: 130 for Ctrl-C, 128 + N for signal N."""
        return settings.EXIT_INTERRUPTED if self.signal is None else 128 + self.signal


@contextlib.contextmanager
def stopping_signals() -> Iterator[Interruption]:
    """While inside, SIGTERM and SIGHUP raise ``KeyboardInterrupt``; a signal that was ignored
    when the command started (``nohup`` ignores SIGHUP) stays ignored."""
    interruption = Interruption()
    previous = {}
    for sig in STOPPING:
        if signal.getsignal(sig) is signal.SIG_DFL:
            previous[sig] = signal.signal(sig, interruption.handle)
    try:
        yield interruption
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
