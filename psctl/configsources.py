"""Where each setting of ``psctl launch`` comes from, lowest precedence first:

defaults < user file (``<user config dir>/psctl/config.toml``) < project file (``./psctl.toml``,
else ``[tool.psctl]`` of ``./pyproject.toml``) < ``--config FILE`` < ``PSCTL_SECTION__KEY``
environment variables < command-line flags. ``--no-config`` skips the user and project files.

Every layer is checked for unknown keys on its own, so a typo is reported with the file or
variable it came from; the merged values are validated once, as a RunConfig, by the launcher.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.analysis.selection import flatten
from engine.catalog import own_settings
from engine.config import RunConfig, check_nesting, load_toml
from engine.errors import ConfigError

ENV_PREFIX = "PSCTL_"
ENV_SEPARATOR = "__"  # PSCTL_CLUSTER__WORKERS=8 sets cluster.workers


@dataclass(frozen=True)
class Layer:
    name: str  # "user file", "project file", "--config", "env", "flag"
    values: dict[str, Any]  # dotted key -> value
    origins: dict[str, str]  # dotted key -> where exactly (a path or a variable name)


def user_config_file() -> Path:
    import platformdirs  # only when a config is resolved

    return Path(platformdirs.user_config_dir("psctl")) / "config.toml"


def known_keys() -> set[str]:
    """Every setting a layer may give: the config's, and each policy's own in its table."""
    keys = set(flatten(RunConfig().to_json_dict()))
    for section, name, model in own_settings():
        keys |= {f"{section}.{name}.{key}" for key in flatten(model().model_dump(mode="json"))}
    return keys


def file_layer(name: str, path: Path, table: str | None = None) -> Layer:
    """A TOML file's settings (only its ``[tool.psctl]`` table when ``table`` is given)."""
    values: Any = load_toml(path)
    for part in (table or "").split(".") if table else ():
        values = values.get(part, {}) if isinstance(values, dict) else {}
    flat = flatten(values if isinstance(values, dict) else {})
    return _checked(Layer(name, flat, dict.fromkeys(flat, str(path))))


def project_layer(cwd: Path) -> Layer | None:
    if (cwd / "psctl.toml").is_file():
        return file_layer("project file", cwd / "psctl.toml")
    pyproject = cwd / "pyproject.toml"
    if pyproject.is_file():
        layer = file_layer("project file", pyproject, "tool.psctl")
        if layer.values:
            return Layer(layer.name, layer.values, dict.fromkeys(layer.values,
                                                                 f"{pyproject} [tool.psctl]"))
    return None


def env_layer(environ: Mapping[str, str]) -> Layer:
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for var, raw in environ.items():
        if not var.startswith(ENV_PREFIX) or ENV_SEPARATOR not in var:
            continue  # PSCTL_DB, PSCTL_DATA_DIR, PSCTL_TOKEN... are not run settings
        key = var[len(ENV_PREFIX):].lower().replace(ENV_SEPARATOR, ".")
        values[key] = _env_value(raw)
        check_nesting(values[key], f"environment variable {var}")
        origins[key] = var
    return _checked(Layer("env", values, origins))


def _env_value(raw: str) -> Any:
    # TOML's value syntax: 8 is an int, 0.1 a float, true a bool, [256, 256] a list.
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        return raw


def flag_layer(overrides: Mapping[str, Any]) -> Layer:
    values = {k: v for k, v in overrides.items() if v is not None}
    return Layer("flag", values, dict.fromkeys(values, "command line"))


def layers(
    config_file: Path | None,
    *,
    no_config: bool = False,
    cwd: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[Layer]:
    """Every layer below the flags, lowest precedence first."""
    found: list[Layer] = []
    if not no_config:
        user = user_config_file()
        if user.is_file():
            found.append(file_layer("user file", user))
        project = project_layer(Path.cwd() if cwd is None else cwd)
        if project is not None:
            found.append(project)
    if config_file is not None:
        found.append(file_layer("--config", config_file))
    found.append(env_layer(os.environ if environ is None else environ))
    return found


def merged_values(stack: list[Layer]) -> dict[str, Any]:
    """The layers' settings as nested sections, later layers winning key by key."""
    nested: dict[str, Any] = {}
    for layer in stack:
        for dotted, value in layer.values.items():
            section = nested
            *parents, leaf = dotted.split(".")
            for part in parents:
                section = section.setdefault(part, {})
            section[leaf] = value
    return nested


def explain(stack: list[Layer], config: RunConfig) -> list[dict[str, Any]]:
    """Each resolved key with its value and the layer (and file or variable) it came from."""
    rows = []
    for key, value in sorted(flatten(config.to_json_dict()).items()):
        source = "default"
        for layer in stack:
            if key in layer.values:
                source = f"{layer.name}: {layer.origins[key]}"
        rows.append({"key": key, "value": value, "source": source})
    return rows


def _checked(layer: Layer) -> Layer:
    known = known_keys()
    for key in layer.values:
        parts = key.split(".")
        if not any(".".join(parts[:n]) in known for n in range(1, len(parts) + 1)):
            raise ConfigError(f"unknown setting {key!r} from {layer.name} "
                              f"{layer.origins[key]}; {_nearest(key, known)}")
    return layer


def _nearest(key: str, known: set[str]) -> str:
    """What was probably meant: the nearest keys of its section (or, in a misspelt section,
    of all), else the keys of its section, else the sections. A typo answered with all ~120
    settings hides the one that matters."""
    section, _, leaf = key.rpartition(".")
    own = sorted(k[len(section) + 1:] for k in known if section and k.startswith(section + "."))
    near = ([f"{section}.{k}" for k in difflib.get_close_matches(leaf[:200], own, n=2)]
            if own else difflib.get_close_matches(key[:200], sorted(known), n=2, cutoff=0.75))
    if near:
        return "did you mean " + " or ".join(repr(k) for k in near) + "?"
    if own:
        return f"[{section}] takes: {', '.join(own)}"
    sections = sorted({k.rpartition(".")[0] for k in known if "." in k})
    return (f"the sections are: {', '.join(f'[{s}]' for s in sections)}; and at the top: "
            f"{', '.join(sorted(k for k in known if '.' not in k))}")
