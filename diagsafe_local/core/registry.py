"""A small generic registry: named entries with one-line descriptions and 'did you mean' on typos."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

from diagsafe_local.core.errors import DiagsafeError


class Named(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...


T = TypeVar("T", bound=Named)


class UnknownNameError(DiagsafeError):
    """Raised for a name that is not in a registry."""


class Registry(Generic[T]):
    """Entries by unique name, in registration order."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def add(self, entry: T) -> T:
        """Register `entry`; a second entry of the same name is a programming error."""
        if entry.name in self._entries:
            raise ValueError(f"{self.kind} '{entry.name}' is registered twice")
        self._entries[entry.name] = entry
        return entry

    def get(self, name: str) -> T:
        """The entry called `name`, or an error that suggests the closest names."""
        try:
            return self._entries[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self._entries), n=3, cutoff=0.6)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise UnknownNameError(f"unknown {self.kind} '{name}'.{hint} See the full list with --list.") from None

    def names(self) -> list[str]:
        return list(self._entries)

    def __iter__(self) -> Iterator[T]:
        return iter(self._entries.values())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)
