"""A wrong key in a settings file or variable is named with what was probably meant, never
answered with every one of the ~120 settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import ConfigError
from psctl.configsources import env_layer, file_layer


def _refusal(tmp_path: Path, text: str) -> str:
    path = tmp_path / "run.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        file_layer("--config", path)
    return str(refused.value)


@pytest.mark.parametrize(("text", "meant"), [
    ("[train]\nepoch = 3\n", "train.epochs"),
    ("[trian]\nepochs = 3\n", "train.epochs"),
    ("[optimizer]\nmomentun = 0.9\n", "optimizer.momentum"),
    ("[cluster]\nworker = 4\n", "cluster.workers"),
])
def test_a_misspelt_key_is_answered_with_the_nearest_one(tmp_path: Path, text: str,
                                                         meant: str) -> None:
    message = _refusal(tmp_path, text)
    assert f"did you mean {meant!r}?" in message, message
    assert str(tmp_path / "run.toml") in message  # where it came from
    assert "cluster.backend" not in message  # not the whole list


def test_a_key_like_none_lists_its_sections_keys_or_the_sections(tmp_path: Path) -> None:
    message = _refusal(tmp_path, "[stop]\nzzzz = 1\n")
    assert "'stop.zzzz'" in message and "[stop] takes: " in message
    assert "target_accuracy" in message and "cluster." not in message
    message = _refusal(tmp_path, "[qqqq]\nzzzz = 1\n")
    assert "the sections are: " in message and "[train]" in message
    assert len(message) < 400, message


def test_a_misspelt_variable_is_named_with_its_own_spelling() -> None:
    with pytest.raises(ConfigError, match=r"PSCTL_TRAIN__EPOCH; did you mean 'train.epochs'"):
        env_layer({"PSCTL_TRAIN__EPOCH": "3"})
