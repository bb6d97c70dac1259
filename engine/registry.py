"""Named policies: one ``Registry`` per kind (consistency model, optimizer, aggregation rule,
worker loop, gradient filter, backend, ...).

A policy is registered once, with what the rest of psctl asks of it without running it: its
one-line summary, its capabilities, its rules about the rest of a run (``requires``), the settings
it implies, and its implementation, which may be ``Lazy``: named as ``"module:attribute"`` and
imported on first use, so that ``psctl --help`` and the run's composition (``engine.plan``) list
and check the policies without importing workers, servers or torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from engine.errors import ConfigError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from engine.config import RunConfig

T = TypeVar("T")
M = TypeVar("M", bound="BaseModel")
# A policy's rule about the rest of the run: raises ValueError, saying what to change, when the
# run combines the policy with something it cannot work with; returns when it can.
Rule = Callable[["RunConfig"], None]


@dataclass(frozen=True, slots=True)
class Lazy:
    """An implementation named by ``"package.module:attribute"``, imported when first asked for."""

    target: str

    def load(self) -> Any:
        module, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True, slots=True)
class Entry(Generic[T]):
    name: str
    value: T | Lazy
    summary: str
    # What the policy can do that others of its kind cannot (a consistency model that counts a
    # changing set of workers, say): asked through the registry, never by the policy's name.
    capabilities: frozenset[str] = frozenset()
    # What the policy needs of the run it is chosen for (engine.plan asks, in this order).
    requires: tuple[Rule, ...] = ()
    # Settings (dotted) the policy implies unless the run gives them: L-BFGS applies pushes as
    # they come, summed. A run that gives another value is then refused by ``requires``.
    implies: Mapping[str, object] = field(default_factory=dict)
    # The policy's own settings (a frozen pydantic model): a table named after the policy in
    # the section of the setting that names it ([sync.NAME]), each field with a flag
    # (engine.config.flag) a psctl launch option. None: it has none of its own.
    settings: type[BaseModel] | None = None


class Registry(Generic[T]):
    """Policies of one kind by name, in registration order."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, value: T | Lazy, summary: str, *,
                 capabilities: frozenset[str] = frozenset(),
                 requires: tuple[Rule, ...] = (),
                 implies: Mapping[str, object] | None = None,
                 settings: type[BaseModel] | None = None) -> None:
        if name in self._entries:
            raise ConfigError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = Entry(name, value, summary, frozenset(capabilities),
                                    tuple(requires), dict(implies or {}), settings)

    @contextmanager
    def registered(self, name: str, value: T | Lazy, summary: str,
                   **options: Any) -> Iterator[None]:
        """``name`` registered (in place of what it was) for the duration of a ``with``: a
        test's or a study's stand-in, which leaves the registry as it found it."""
        before = self._entries.pop(name, None)
        self.register(name, value, summary, **options)
        try:
            yield
        finally:
            del self._entries[name]
            if before is not None:
                self._entries[name] = before

    def settings_of(self, name: str, section: BaseModel, model: type[M]) -> M:
        """Policy ``name``'s own settings (registered as ``model``), read from its table in
        ``section``, the config section that names it (engine.plan checked the table when it
        composed the run)."""
        if self.entry(name).settings is not model:
            raise ConfigError(f"{self.kind} {name!r} has no settings {model.__name__}")
        return model.model_validate((section.model_extra or {}).get(name, {}))

    def implied(self, name: str) -> Mapping[str, object]:
        """The settings policy ``name`` implies (an empty mapping for an unknown name)."""
        entry = self._entries.get(name)
        return entry.implies if entry is not None else {}

    def check(self, name: str, run: RunConfig) -> None:
        """Run policy ``name``'s rules on ``run``: ValueError from the first it breaks."""
        for rule in self.entry(name).requires:
            rule(run)

    def can(self, name: str, capability: str) -> bool:
        """Whether policy ``name`` has ``capability`` (a ConfigError for an unknown name)."""
        return capability in self.entry(name).capabilities

    def able(self, capability: str) -> tuple[str, ...]:
        """The policies with ``capability``, in registration order."""
        return tuple(e.name for e in self if capability in e.capabilities)

    def entry(self, name: str) -> Entry[T]:
        """What is registered as ``name``, its implementation not loaded (a ConfigError listing
        the known names for an unknown one)."""
        entry = self._entries.get(name)
        if entry is None:
            raise ConfigError(f"unknown {self.kind} {name!r} (known: {', '.join(self.names())})")
        return entry

    def get(self, name: str) -> T:
        """Policy ``name``'s implementation (imported now if it was registered ``Lazy``)."""
        entry = self.entry(name)
        if isinstance(entry.value, Lazy):
            entry = replace(entry, value=entry.value.load())
            self._entries[name] = entry
        return cast(T, entry.value)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(self._entries.values())

    def describe(self) -> str:
        """``name (summary); ...``: what ``--help`` prints."""
        return "; ".join(f"{e.name}: {e.summary}" for e in self)
