"""Each psctl launch flag sets its own setting (docs/cli: --momentum is optimizer.momentum, ...):
the options, by the launch command's parameter names, resolved to a run's configuration in
process. The expected settings are written out here, not read from launchopts.SETTINGS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.config import RunConfig
from psctl.launchopts import launch_config

# option -> (value given, where the run's configuration must hold it); values are distinct and
# none is a default, so a flag wired to another setting (or to none) shows.
FLAGS: dict[str, tuple[Any, tuple[str, str]]] = {
    "lr": (0.125, ("optimizer", "lr")),
    "momentum": (0.375, ("optimizer", "momentum")),
    "clip_norm": (7.5, ("optimizer", "clip_norm")),
    "max_seconds": (321.0, ("stop", "max_seconds")),
    "target_accuracy": (0.625, ("stop", "target_accuracy")),
    "eval_interval": (4.5, ("eval", "interval_s")),
    "workers": (3, ("cluster", "workers")),
    "servers": (2, ("cluster", "servers")),
    "epochs": (4, ("train", "epochs")),
    "seed": (17, ("train", "seed")),
}


def configured(options: dict[str, Any], tmp_path: Path) -> RunConfig:
    # digits: resolving the configuration looks for the data set, and digits needs no files.
    return launch_config({"dataset": "digits", **options, "no_config": True},
                         tmp_path / "experiments.db")


@pytest.mark.parametrize("option", sorted(FLAGS))
def test_a_launch_flag_sets_its_own_setting_and_no_other(option: str, tmp_path: Path) -> None:
    value, (section, field) = FLAGS[option]
    default = configured({}, tmp_path)
    config = configured({option: value}, tmp_path)
    assert getattr(getattr(config, section), field) == value
    # Nothing else moved: the configuration is the default one with this setting changed.
    changed = default.model_copy(update={section: getattr(default, section).model_copy(
        update={field: value})})
    assert config == changed


def test_every_flag_at_once_keeps_each_value_apart(tmp_path: Path) -> None:
    config = configured({option: value for option, (value, _) in FLAGS.items()}, tmp_path)
    got = {option: getattr(getattr(config, section), field)
           for option, (_, (section, field)) in FLAGS.items()}
    assert got == {option: value for option, (value, _) in FLAGS.items()}
