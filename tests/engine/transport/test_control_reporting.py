"""What a role tells the coordinator when the user's code fails: a call psctl.log refused is
reported as that code's crash (where in the user's file, the traceback ending there), even
where psctl's own errors are left to the coordinator."""

from __future__ import annotations

import pytest

import psctl
from engine.errors import ConfigError, MetricError
from engine.transport.control import SyncControl
from engine.wire.messages import Fatal


def _forward() -> None:
    psctl.log("bad name", 1.0)


def reporter() -> tuple[SyncControl, list[Fatal]]:
    control = SyncControl.__new__(SyncControl)  # no channel: only what it would report
    said: list[Fatal] = []
    control._report = said.append  # type: ignore[method-assign]
    return control, said


def test_a_refused_psctl_log_is_reported_as_the_users_crash() -> None:
    control, said = reporter()
    with pytest.raises(MetricError), control.reporting(own_errors=False):
        _forward()
    [fatal] = said
    assert fatal.message.startswith("MetricError: psctl.log('bad name', ...) at "
                                    "test_control_reporting.py line")
    line = _forward.__code__.co_firstlineno + 1
    assert fatal.message.endswith(f"(in _forward, test_control_reporting.py line {line})")
    assert "usermetrics.py" not in fatal.traceback and 'psctl.log("bad name"' in fatal.traceback


def test_psctl_own_errors_are_still_left_to_the_coordinator() -> None:
    control, said = reporter()
    with pytest.raises(ConfigError), control.reporting(own_errors=False):
        raise ConfigError("the coordinator says why itself")
    assert said == []
