"""A small generic registry: named entries with one-line descriptions, 'did you mean' on typos, entries from
installed plugins, and entries made on demand from a name (a policy file's path, a metric with a threshold).

Plugins follow the packaging convention: an installed distribution declares entry points in the registry's
group (`diagsafe_local.judges`, `diagsafe_local.metrics`, ...); each resolves to what the built-ins register
(the registry's `adapt` turns it into entries). They load the first time the registry is read. A plugin that
fails to load (raises anything, `SystemExit` included), or gives something that is not an entry, is one warning
naming its package; the other entries still work. The read side (`runs`) never reads a registry.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata
from typing import Any, Generic, Protocol, TypeVar

from diagsafe_local.core.errors import DiagsafeError, Interrupted

log = logging.getLogger("diagsafe_local.plugins")
BUILT_IN = "diagsafe-local"


class Named(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...


T = TypeVar("T", bound=Named)


class UnknownNameError(DiagsafeError):
    """Raised for a name that is not in a registry."""


class Registry(Generic[T]):
    """Entries by unique name, in registration order (built-ins first, then plugins, then entries made on
    demand), each with the distribution it came from."""

    def __init__(
        self,
        kind: str,
        plugin_group: str | None = None,
        adapt: Callable[[Any, str], Iterable[T]] | None = None,
        resolve: Callable[[str], tuple[T, str] | None] | None = None,
    ) -> None:
        self.kind = kind
        self.plugin_group = plugin_group
        self._adapt = adapt or (lambda obj, name: [obj])
        self._resolve = resolve
        self._entries: dict[str, T] = {}
        self._origins: dict[str, str] = {}
        self._plugins_loaded = plugin_group is None

    def resolve_with(self, resolve: Callable[[str], tuple[T, str] | None]) -> None:
        """Make entries on demand from names the registry does not hold: `resolve(name)` gives (entry, origin)."""
        self._resolve = resolve

    def add(self, entry: T, origin: str = BUILT_IN) -> T:
        """Register `entry`; a second entry of the same name is a programming error."""
        if entry.name in self._entries:
            raise ValueError(f"{self.kind} '{entry.name}' is registered twice")
        self._entries[entry.name] = entry
        self._origins[entry.name] = origin
        return entry

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for point in metadata.entry_points(group=self.plugin_group or ""):
            package = point.dist.name if point.dist is not None else point.value.split(":")[0]
            try:
                entries = list(self._adapt(point.load(), point.name))
                for entry in entries:
                    self.add(entry, origin=package)
            except (KeyboardInterrupt, Interrupted):
                raise  # the user's interrupt is still an interrupt
            except BaseException as exc:  # a broken plugin (even one that calls sys.exit) is one warning, no more
                log.warning(
                    "plugin %s: %s entry point '%s' (%s) was not loaded: %s: %s",
                    package,
                    self.kind,
                    point.name,
                    point.value,
                    type(exc).__name__,
                    exc,
                )

    def get(self, name: str) -> T:
        """The entry called `name` (made on demand where the registry can), or an error suggesting the closest."""
        self._load_plugins()
        if name in self._entries:
            return self._entries[name]
        resolved = self._resolve(name) if self._resolve is not None else None
        if resolved is not None:
            made, origin = resolved
            known = self._entries.get(made.name)
            if known is None:
                return self.add(made, origin=origin)
            if known != made:
                raise DiagsafeError(
                    f"{name} defines {self.kind} '{made.name}', but another {self.kind} of that name is already "
                    f"known (from {self._origins[made.name]}): give it a name of its own"
                )
            return known
        close = difflib.get_close_matches(name, list(self._entries), n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownNameError(f"unknown {self.kind} '{name}'.{hint} See the full list with --list.")

    def origin(self, name: str) -> str:
        """The distribution an entry came from (diagsafe-local for built-ins, 'file' for a policy file)."""
        self._load_plugins()
        return self._origins[name]

    def names(self) -> list[str]:
        self._load_plugins()
        return list(self._entries)

    def __iter__(self) -> Iterator[T]:
        self._load_plugins()
        return iter(list(self._entries.values()))

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._entries

    def __len__(self) -> int:
        self._load_plugins()
        return len(self._entries)
