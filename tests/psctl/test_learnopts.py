"""The launch's warnings for Downpour's summed pushes on servers with momentum, and for a
momentum kept on the workers and applied again on the servers."""

from __future__ import annotations

from engine.plan import build_config
from psctl.learnopts import downpour_momentum_note, momentum_twice_note


def test_downpour_with_server_momentum_is_warned_about() -> None:
    risky = build_config({}, {"sync.model": "asp", "train.push_every": 4})
    note = downpour_momentum_note(risky)
    assert note is not None and "momentum 0.9" in note and "--optimizer adagrad" in note
    assert downpour_momentum_note(build_config({}, {"sync.model": "asp"})) is None
    for fix in ({"optimizer.name": "adagrad"}, {"optimizer.momentum": 0.0},
                {"train.push_every": 1, "train.warm_start": 10}):
        config = build_config({}, {"sync.model": "asp", "train.push_every": 4, **fix})
        assert downpour_momentum_note(config) is None, fix


def test_momentum_correction_on_servers_with_momentum_is_warned_about() -> None:
    dgc = {"comm.prune": "topk:1", "comm.momentum_correction": 0.9}
    note = momentum_twice_note(build_config({}, dgc))
    assert note == ("--momentum-correction 0.9 keeps a momentum on the workers (Deep Gradient "
                    "Compression); server momentum 0.9 applies one again to what they push: add "
                    "--momentum 0")
    assert momentum_twice_note(build_config({}, {"comm.prune": "topk:1"})) is None
    for fix in ({"optimizer.momentum": 0.0}, {"optimizer.name": "adagrad"}):
        assert momentum_twice_note(build_config({}, {**dgc, **fix})) is None, fix
