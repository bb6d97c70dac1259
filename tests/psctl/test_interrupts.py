"""SIGTERM and SIGHUP stop a run as Ctrl-C does, with the exit code a shell gives the signal
(the runs themselves: tests/integration/test_run_stops.py)."""

from __future__ import annotations

import os
import signal

import pytest

from psctl.interrupts import stopping_signals


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stopping_signal_is_a_keyboard_interrupt_and_sets_the_exit_code(
        sig: signal.Signals, code: int) -> None:
    # Under nohup (or a CI runner that ignores SIGHUP) the signal arrives ignored, and
    # stopping_signals rightly leaves it so: this test starts from the default.
    inherited = signal.signal(sig, signal.SIG_DFL)
    try:
        _signal_interrupts(sig, code)
    finally:
        signal.signal(sig, inherited)


def _signal_interrupts(sig: signal.Signals, code: int) -> None:
    before = signal.getsignal(sig)
    with stopping_signals() as interruption:
        assert interruption.exit_code == 130  # nothing came: Ctrl-C's
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), sig)
            signal.sigtimedwait([], 0)  # the handler runs between two bytecodes
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)  # a second one: the first still names it
            signal.sigtimedwait([], 0)
    assert interruption.exit_code == code
    assert signal.getsignal(sig) == before


def test_a_signal_ignored_at_the_start_stays_ignored() -> None:
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with stopping_signals() as interruption:
            os.kill(os.getpid(), signal.SIGHUP)
            signal.sigtimedwait([], 0)
        assert interruption.signal is None
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
