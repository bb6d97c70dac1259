"""Named policies: one ``Registry`` per kind (consistency model, optimizer, aggregation rule,
worker loop, gradient filter, partitioner).

A policy module registers itself once; the config's allowed names, ``psctl launch --help`` and the
docs' tables are read from the registry, so a new policy is one module plus its registration.
Registries are plain objects passed to whoever builds policies, never looked up by string path.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from engine.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Entry(Generic[T]):
    name: str
    value: T
    summary: str
    # What the policy can do that others of its kind cannot (a consistency model that counts a
    # changing set of workers, say): asked through the registry, never by the policy's name.
    capabilities: frozenset[str] = frozenset()


class Registry(Generic[T]):
    """Policies of one kind by name, in registration order."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, value: T, summary: str, *,
                 capabilities: frozenset[str] = frozenset()) -> T:
        if name in self._entries:
            raise ConfigError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = Entry(name, value, summary, frozenset(capabilities))
        return value

    def can(self, name: str, capability: str) -> bool:
        """Whether policy ``name`` has ``capability`` (a ConfigError for an unknown name)."""
        self.get(name)
        return capability in self._entries[name].capabilities

    def able(self, capability: str) -> tuple[str, ...]:
        """The policies with ``capability``, in registration order."""
        return tuple(e.name for e in self if capability in e.capabilities)

    def get(self, name: str) -> T:
        entry = self._entries.get(name)
        if entry is None:
            raise ConfigError(f"unknown {self.kind} {name!r} (known: {', '.join(self.names())})")
        return entry.value

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(self._entries.values())

    def describe(self) -> str:
        """``name (summary); ...``: what ``--help`` prints."""
        return "; ".join(f"{e.name}: {e.summary}" for e in self)
