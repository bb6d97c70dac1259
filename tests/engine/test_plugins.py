"""Plugins: modules named in PSCTL_PLUGINS are imported once; one that fails says which and why."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engine import plugins
from engine.errors import ConfigError


def test_named_modules_are_imported_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "psctl_plugin_a.py").write_text("COUNT = globals().get('COUNT', 0) + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_loaded", set())
    monkeypatch.setenv(plugins.ENV, " psctl_plugin_a , ")
    assert plugins.named() == ["psctl_plugin_a"]
    assert plugins.load() == ["psctl_plugin_a"]
    assert plugins.load() == []  # once
    assert sys.modules["psctl_plugin_a"].COUNT == 1


def test_a_plugin_that_fails_names_itself_and_its_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "psctl_plugin_bad.py").write_text("raise RuntimeError('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_loaded", set())
    monkeypatch.setenv(plugins.ENV, "psctl_plugin_bad")
    with pytest.raises(ConfigError, match=r"plugin psctl_plugin_bad \(PSCTL_PLUGINS="
                                          r"psctl_plugin_bad\) failed to import: RuntimeError: "
                                          "no GPU here"):
        plugins.load()
    monkeypatch.setenv(plugins.ENV, "psctl_no_such_plugin")
    with pytest.raises(ConfigError, match="ModuleNotFoundError"):
        plugins.load()
