"""Composes a run: flags, files and defaults in, one validated ``RunConfig`` out.

``engine.config`` holds the schema (sections, bounds, TOML); the policies hold their own rules,
registered with them (``engine.registry``: a policy's ``requires`` and the settings it
``implies``). This module asks them, in this order:

1. the settings a chosen policy, model or data set implies, where the run does not give them (a
   sparse data set's logistic regression under bounded delay, a hashed file's feature space,
   the embedding model's Adagrad, L-BFGS's asp and summed pushes, the optimizer's own learning
   rate);
2. the schema (every bound, every type);
3. every policy name against its registry, and every spec written as text (``--prune``,
   ``--dataset``, ``--inject``, ...) parsed and stored in its canonical spelling;
4. the rules of each chosen policy, and of each worker loop whose settings the run gives.

``psctl launch``, ``psctl study``, ``psctl resume``, ``psctl scale`` and ``psctl role`` compose
their runs here. A role process reads the config it is handed with ``RunConfig.model_validate``: the
run was composed before it started.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from pydantic import BaseModel, ValidationError

from engine.backends import BACKENDS, settings_apply
from engine.budget import parse_budget
from engine.catalog import NAMED, OWNERS, names, own_settings
from engine.config import RunConfig, describe, merge, validate
from engine.consistency.registry import CONSISTENCY_MODELS
from engine.datasets import hashed
from engine.datasets.sources import check_source, is_sparse_source
from engine.errors import ConfigError
from engine.faults import FaultPlan, check_kills
from engine.models.kinds import MODELS
from engine.models.spec import check_model
from engine.policies.learning import SCHEDULES, STALENESS_RULES
from engine.policies.loops import WORKER_LOOPS, loops_in_use
from engine.policies.optimizers import SERVER_OPTIMIZERS
from engine.registry import Registry
from engine.server.pull_filter import parse_pull_filter
from engine.transport.shaping import parse_network
from engine.worker.filters import parse_prune, warmup_fits

# What a sparse data set implies (seed 003's workload), unless the run says otherwise.
SPARSE_IMPLIES = {"sync.model": "bounded-delay", "model.name": "logreg"}


def build_config(file_values: dict[str, Any], overrides: dict[str, Any]) -> RunConfig:
    """The run of ``file_values`` with ``overrides`` (dotted keys such as ``"cluster.workers"``;
    None: not given) written over them."""
    return parse_config(merge(file_values, overrides))


def parse_config(values: dict[str, Any]) -> RunConfig:
    """The run ``values`` describe, checked by the schema and by every policy it names: a
    ConfigError saying what to change when it cannot run."""
    config = validate(_implied(values))
    _check_names(config)
    config = _canonical(_own_settings(config))
    problems = _broken_rules(config)
    if problems:
        raise ConfigError("invalid configuration: " + "; ".join(problems))
    return config


def _get(values: dict[str, Any], dotted: str) -> Any:
    section: Any = values
    for part in dotted.split("."):
        if not isinstance(section, dict):
            return None
        section = section.get(part)
    return section


def _implied(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with what its policies imply filled in where it gives nothing."""
    implied: dict[str, object] = {}
    dataset = _get(values, "data.dataset")
    if isinstance(dataset, str) and is_sparse_source(dataset):
        implied |= SPARSE_IMPLIES
    if isinstance(dataset, str) and hashed.is_hashed(dataset):
        implied |= hashed.IMPLIES
    defaults = RunConfig().to_json_dict()
    # The model's optimizer, the optimizer's learning rate, L-BFGS's asp, ...: each named as the
    # run gives it, else as what came before implies it (a sparse data set's logreg, the
    # embedding model's adagrad), else by default.
    for dotted, registry in OWNERS.items():
        name = _get(values, dotted)
        if not isinstance(name, str):
            name = implied.get(dotted, _get(defaults, dotted))
        implied |= registry.implied(_spelled(dotted, name))
    missing = {key: value for key, value in implied.items() if _get(values, key) is None
               and _sections_are_tables(values, key)}
    return merge(values, missing)


def _spelled(dotted: str, name: Any) -> Any:
    """A registered model's name as check_model spells it (--model Embedding is the embedding
    model), which it does only after the tables are read; any other name as it is."""
    if dotted == "model.name" and isinstance(name, str) and name.strip().lower() in MODELS:
        return name.strip().lower()
    return name


def _sections_are_tables(values: dict[str, Any], dotted: str) -> bool:
    # A section given as something else is the schema's to refuse, with its own message.
    section: Any = values
    for part in dotted.split(".")[:-1]:
        section = section.get(part, {}) if isinstance(section, dict) else None
    return isinstance(section, dict)


def _check_names(config: RunConfig) -> None:
    values = config.to_json_dict()
    problems = []
    for dotted, registry in NAMED.items():
        name, known = _get(values, dotted), names(dotted)
        if name not in known:
            problems.append(f"{dotted}: unknown {registry.kind} {name!r} "
                            f"(known: {', '.join(known)})")
    if problems:
        raise ConfigError("invalid configuration: " + "; ".join(problems))


def _own_settings(config: RunConfig) -> RunConfig:
    """Each policy's own settings table checked by its settings model and stored whole (the
    chosen policy's defaults written out); any other key a section does not know is refused."""
    values = config.to_json_dict()
    owners = {(section, name): model for section, name, model in own_settings()}
    problems: list[str] = []
    for section in sorted({dotted.split(".")[0] for dotted in OWNERS}):
        tables = dict(getattr(config, section).model_extra or {})
        for dotted in OWNERS:  # the chosen policy's table, its defaults where none is given
            chosen = _spelled(dotted, _get(values, dotted))
            if dotted.startswith(section + ".") and (section, chosen) in owners:
                tables.setdefault(chosen, {})
        for name, table in tables.items():
            checked = _own_table(section, name, table, owners.get((section, name)))
            if isinstance(checked, str):
                problems.append(checked)
            else:
                values[section][name] = checked
    if problems:
        raise ConfigError("invalid configuration: " + "; ".join(problems))
    return validate(values)


def _own_table(section: str, name: str, table: Any,
               model: type[BaseModel] | None) -> dict[str, Any] | str:
    """The table ``[section.name]`` as its policy's settings store it, or what is wrong."""
    if model is None:
        return f"{section}.{name}: no such setting, nor a policy with settings of its own"
    if not isinstance(table, dict):
        return (f"{section}.{name}: the settings of {name} are a table ([{section}.{name}]), "
                f"not {table!r}")
    try:
        return model.model_validate(table).model_dump(mode="json")
    except ValidationError as exc:
        return describe(exc, (section, name)).removeprefix("invalid configuration: ")


def _network(spec: str | None) -> str | None:
    return None if spec is None else parse_network(spec).spec


def _pull_filter(spec: str) -> str:
    parsed = parse_pull_filter(spec)
    return parsed.name if parsed.name == "none" else f"{parsed.name}:{parsed.delta:g}"


def _budget(text: str | None) -> str | None:
    return None if text is None else parse_budget(text).text


def _faults(specs: list[str]) -> list[str]:
    FaultPlan.of(tuple(specs))
    return [spec.strip().lower() for spec in specs]


# Settings written as specs, each with the parser that checks it and gives its canonical text.
# A ConfigError of the first two is whole already (it names the value and what to use).
CANONICAL: tuple[tuple[str, Callable[[Any], Any], bool], ...] = (
    ("data.dataset", check_source, False), ("model.name", check_model, False),
    ("comm.prune", lambda spec: parse_prune(spec).spec, True),
    ("comm.pull_filter", _pull_filter, True),
    ("regime.network", _network, True), ("regime.server_network", _network, True),
    ("fault.inject", _faults, True), ("stop.budget", _budget, True))


def _canonical(config: RunConfig) -> RunConfig:
    values = config.to_json_dict()
    problems = []
    for dotted, parse, located in CANONICAL:
        section, leaf = dotted.split(".")
        try:
            values[section][leaf] = parse(values[section][leaf])
        except (ConfigError, ValueError) as exc:
            if not located and isinstance(exc, ConfigError):
                raise
            problems.append(f"{dotted}: {exc}")
    if problems:
        raise ConfigError("invalid configuration: " + "; ".join(problems))
    return validate(values)


def _warmup_fits(config: RunConfig) -> None:
    warmup_fits(config.comm)


def _broken_rules(config: RunConfig) -> list[str]:
    checks: list[tuple[Registry[Any], str]] = [
        (BACKENDS, config.cluster.backend), (CONSISTENCY_MODELS, config.sync.model),
        (SERVER_OPTIMIZERS, config.optimizer.name), (SCHEDULES, config.learning.schedule),
        (STALENESS_RULES, config.learning.rule)]
    checks += [(WORKER_LOOPS, loop) for loop in loops_in_use(config)]
    if config.model.name in MODELS:  # a user's file has none
        checks.append((MODELS, config.model.name))
    problems: list[str] = []
    rules: list[Callable[[RunConfig], None]] = [
        partial(registry.check, name) for registry, name in checks]
    for rule in [*rules, check_kills, _warmup_fits, hashed.hash_features_fit, settings_apply]:
        try:
            rule(config)
        except ValueError as exc:
            if str(exc) not in problems:
                problems.append(str(exc))
    return problems
