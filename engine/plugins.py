"""Policies from outside psctl: a module that registers a consistency model (or an optimizer, a
loop, ...) when imported is loaded by naming it in ``PSCTL_PLUGINS`` (module names, comma
separated, importable from ``sys.path``) or by an entry point in the ``psctl.plugins`` group of
an installed package. ``engine.catalog`` loads them before anything lists or checks a policy,
and every role process before it builds one, so the launcher, the CLI and each process of a
run see the same registries (the variable is inherited by the processes a run starts)."""

from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points

from engine.errors import ConfigError

ENV = "PSCTL_PLUGINS"
GROUP = "psctl.plugins"
_loaded: set[str] = set()


def named(environ: dict[str, str] | None = None) -> list[str]:
    """The plugin modules ``PSCTL_PLUGINS`` names, in order."""
    text = (os.environ if environ is None else environ).get(ENV, "")
    return [name.strip() for name in text.split(",") if name.strip()]


def load() -> list[str]:
    """Import every plugin not imported yet (a ConfigError names the one that fails and why);
    returns the modules imported now."""
    found = [(name, f"{ENV}={os.environ.get(ENV, '')}") for name in named()]
    found += [(point.value.split(":")[0], f"entry point {point.name} of {GROUP}")
              for point in entry_points(group=GROUP)]
    imported = []
    for module, origin in found:
        if module in _loaded:
            continue
        _loaded.add(module)  # once, even when it fails: the error is said once
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise ConfigError(f"plugin {module} ({origin}) failed to import: "
                              f"{type(exc).__name__}: {exc}") from exc
        imported.append(module)
    return imported
