"""``psctl launch``'s options, made from the run's settings: every field of ``engine.config``
that carries a flag (``_flag``) is one option, named, typed and explained by its field, in its
section of the help. The few options that are not one setting (a file to read, a run to look
up, a spec that sets several values, how to show the run) are declared once, below.
``psctl role coordinator`` takes the same options and goes through here too, so that a run
started by hand is configured exactly as one that psctl launches."""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typer
import typer.core
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from engine.catalog import NAMED, implied, names, own_settings
from engine.config import RunConfig, whole_number
from engine.errors import ConfigError
from psctl.cliutil import DbOption, parse_accuracy
from psctl.settings import OptionError

RUN_PANEL = "run"


def parse_whole(text: str) -> int:
    """typer's parser of a whole-number option written as psctl's specs write one (``2^24``):
    a bad value is a usage error (exit 2) that names the option."""
    try:
        return whole_number(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a whole number such as 2^24 or "
                                 "16777216") from None


# Settings whose flag reads its value its own way: the parser, and the help that says how
# (None: the field's description says it).
PARSED: dict[str, tuple[Callable[[str], Any], str | None]] = {
    "stop.target_accuracy": (parse_accuracy, "stop once the test accuracy reaches A: a "
                             "fraction (0.97) or a percentage (97)"),
    "data.hash_features": (parse_whole, None),
}


@dataclass(frozen=True)
class SettingOption:
    """One setting's option: ``--staleness`` sets ``sync.staleness``."""

    setting: str
    flag: str
    kind: type
    many: bool
    help: str
    choices: tuple[str, ...] = ()  # a Literal's values (a policy's come from its registry)

    @property
    def param(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def section(self) -> str:
        return self.setting.split(".")[0] if "." in self.setting else RUN_PANEL


def _fields(model: type[BaseModel], prefix: str) -> list[tuple[str, FieldInfo]]:
    found = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found += _fields(annotation, f"{prefix}{name}.")
        else:
            found.append((prefix + name, info))
    return found


def _literal(annotation: Any) -> tuple[str, ...]:
    """The values of a ``Literal`` annotation (optional or not), else none."""
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(v for arg in get_args(annotation) for v in _literal(arg))
    return tuple(map(str, get_args(annotation))) if get_origin(annotation) is Literal else ()


def _kind(annotation: Any) -> tuple[type, bool]:
    """The option's value type for a field's annotation, and whether it repeats."""
    if get_origin(annotation) in (Union, types.UnionType):
        annotation = next(arg for arg in get_args(annotation) if arg is not type(None))
    if get_origin(annotation) is Literal:
        return str, False
    if get_origin(annotation) is tuple:
        return get_args(annotation)[0], True
    assert annotation in (int, float, str, bool), annotation
    return annotation, False


def _help(setting: str, info: FieldInfo) -> str:
    text = info.description or ""
    if setting in NAMED:
        listed = names(setting)
        choices = ", ".join(listed[:-1]) + f" or {listed[-1]}"
        text = text.replace("{choices}", f"{choices} [{info.default}]")
    return text.replace("{implied}", ", ".join(
        f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}"
        for name, value in implied(setting)))


def _policy_fields() -> list[tuple[str, FieldInfo]]:
    """The policies' own settings, each in its table: ``sync.NAME.FIELD``."""
    return [field for section, name, model in own_settings()
            for field in _fields(model, f"{section}.{name}.")]


def setting_options() -> tuple[SettingOption, ...]:
    """Every setting's option, in the config's order, then the policies' own."""
    options: dict[str, SettingOption] = {}
    for setting, info in [*_fields(RunConfig, ""), *_policy_fields()]:
        extra = info.json_schema_extra
        if isinstance(extra, dict) and isinstance(extra.get("flag"), str):
            kind, many = _kind(info.annotation)
            said = PARSED[setting][1] if setting in PARSED else None
            option = SettingOption(setting, str(extra["flag"]), kind, many,
                                   said or _help(setting, info), _literal(info.annotation))
            if option.flag in options:
                raise ConfigError(f"{option.flag} is the flag of both "
                                  f"{options[option.flag].setting} and {setting}")
            options[option.flag] = option
    return tuple(options.values())


def _setting_parameter(option: SettingOption) -> inspect.Parameter:
    decls = (f"{option.flag}/--no-{option.flag.removeprefix('--')}" if option.kind is bool
             else option.flag)
    kind: Any = list[option.kind] if option.many else option.kind  # type: ignore[name-defined]
    parser = PARSED[option.setting][0] if option.setting in PARSED else None
    info = typer.Option(decls, help=option.help, rich_help_panel=option.section, parser=parser,
                        autocompletion=value_completion(option))
    return inspect.Parameter(option.param, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[kind | None, info])


def _datasets() -> tuple[str, ...]:
    from engine.datasets.hashed import PREFIXES
    from engine.datasets.registry import DATASETS
    from engine.datasets.sources import LIBSVM
    from engine.datasets.sparse import PREFIX

    return (*DATASETS.names(), PREFIX, LIBSVM, *(f"{name}:" for name in PREFIXES))


def _models() -> tuple[str, ...]:
    from engine.models.kinds import MODELS

    return MODELS.names()


# Settings that name a registered thing that is no policy, and where its names are listed;
# read only when a shell asks (the registries load numpy, which --help must not).
REGISTERED: dict[str, Callable[[], tuple[str, ...]]] = {
    "data.dataset": _datasets, "model.name": _models}


def choices(option: SettingOption) -> Callable[[], tuple[str, ...]] | None:
    """Where the values a shell completes for ``option`` come from, if it has a set of them."""
    if option.setting in NAMED:
        return lambda: names(option.setting)
    if option.choices:
        return lambda: option.choices
    return REGISTERED.get(option.setting)


def value_completion(option: SettingOption) -> Callable[[str], list[str]] | None:
    """The shell completion of ``option``'s values: the registered names that start with what
    was typed."""
    listed = choices(option)
    if listed is None:
        return None

    def complete(incomplete: str) -> list[str]:
        return [name for name in listed() if name.startswith(incomplete)]

    return complete


def _others(
    history: Annotated[str | None, typer.Option(
        help="elastic: seed the predictor with a recorded run's timings (run selector)",
        rich_help_panel="sync")] = None,
    straggler: Annotated[list[str] | None, typer.Option(
        help="RANK:FACTOR[@ONSET], e.g. 2:3x or 2:3x@60s: slow worker RANK down (repeatable)",
        rich_help_panel="heterogeneity")] = None,
    jitter: Annotated[str | None, typer.Option(
        help="per-iteration compute noise, DISTRIBUTION:SIGMA, e.g. lognormal:0.3",
        rich_help_panel="heterogeneity")] = None,
    lr_schedule: Annotated[str | None, typer.Option(
        help="learning-rate schedule over each shard's updates: constant, step:EVERY[:GAMMA] or "
        "cosine:TOTAL[:FLOOR] [constant]", rich_help_panel="learning")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="TOML file with [cluster], [sync], [train], ... sections",
        rich_help_panel=RUN_PANEL)] = None,
    no_config: Annotated[bool, typer.Option(
        "--no-config", help="ignore ./psctl.toml, [tool.psctl] and the user config file",
        rich_help_panel=RUN_PANEL)] = False,
    db: DbOption = None,
    live: Annotated[bool, typer.Option(help="show live progress",
                                       rich_help_panel=RUN_PANEL)] = True,
    ui: Annotated[bool, typer.Option(
        "--ui/--no-ui", help="serve the live dashboard during the run (127.0.0.1)",
        rich_help_panel=RUN_PANEL)] = False,
    repeat: Annotated[int, typer.Option(
        min=1, max=100, help="run N times, with seeds S, S+1, ..., S+N-1, tagged as one group "
        "(group=NAME) that psctl compare shows as mean ± standard deviation",
        rich_help_panel=RUN_PANEL)] = 1,
) -> None:
    """The options that are not one setting each (their signature is what is read)."""


def signature() -> inspect.Signature:
    """psctl launch's parameters: one per setting with a flag, then the others."""
    settings = [_setting_parameter(option) for option in setting_options()]
    others = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
              for p in inspect.signature(_others, eval_str=True).parameters.values()]
    return inspect.Signature([*settings, *others], return_annotation=None)


def launch_overrides(options: Mapping[str, Any]) -> dict[str, Any]:
    """The settings ``options`` (psctl launch's, by parameter name) override (None: not given,
    the setting keeps its value)."""
    overrides: dict[str, Any] = {}
    for option in setting_options():
        value = options.get(option.param)
        if option.many:  # a repeated option: none given leaves the setting as it is
            value = tuple(value) if value else None
        overrides[option.setting] = value
    return overrides


def launch_config(options: Mapping[str, Any], db: Path) -> RunConfig:
    """The run psctl launch's ``options`` describe, over the config files they name (a
    ConfigError says what is wrong)."""
    from psctl.launch import resolve_config
    from psctl.learnopts import parse_schedule
    from psctl.syncopts import sync_overrides

    overrides = launch_overrides(options)
    try:  # these options are specs of their own: a refusal is a usage error, exit 2
        overrides |= sync_overrides(stragglers=options.get("straggler"),
                                    jitter=options.get("jitter"), history=options.get("history"),
                                    db=db)
        if options.get("lr_schedule") is not None:
            overrides |= parse_schedule(str(options["lr_schedule"]))
    except ConfigError as exc:
        raise OptionError(str(exc)) from None
    return resolve_config(options.get("config"), overrides,
                          no_config=bool(options.get("no_config")))


class SectionedCommand(typer.core.TyperCommand):
    """Help with the options grouped by the section of the settings they set."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        panels: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                panel = getattr(param, "rich_help_panel", None) or RUN_PANEL
                panels.setdefault(panel, []).append(record)
        run = panels.pop(RUN_PANEL, [])  # how to run it, after what the run is
        for panel, records in [*panels.items(), (RUN_PANEL, run)]:
            with formatter.section(f"{panel.capitalize()} options"):
                formatter.write_dl(records)
