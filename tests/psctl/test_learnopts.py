"""The launch's warning for Downpour's summed pushes on servers with momentum."""

from __future__ import annotations

from engine.plan import build_config
from psctl.learnopts import downpour_momentum_note


def test_downpour_with_server_momentum_is_warned_about() -> None:
    risky = build_config({}, {"sync.model": "asp", "train.push_every": 4})
    note = downpour_momentum_note(risky)
    assert note is not None and "momentum 0.9" in note and "--optimizer adagrad" in note
    assert downpour_momentum_note(build_config({}, {"sync.model": "asp"})) is None
    for fix in ({"optimizer.name": "adagrad"}, {"optimizer.momentum": 0.0},
                {"train.push_every": 1, "train.warm_start": 10}):
        config = build_config({}, {"sync.model": "asp", "train.push_every": 4, **fix})
        assert downpour_momentum_note(config) is None, fix
