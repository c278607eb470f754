"""Name -> implementation registries with preset arguments (cf. Lightning's strategy registry).

Every pluggable choice (strategy, update rule, model, dataset, Caffe layer converter)
is looked up here, so the list of valid names lives in exactly one place and an
unknown name gets an error that lists the available ones.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    factory: Callable[..., T]
    description: str = ""
    preset: dict[str, Any] = field(default_factory=dict)

    def create(self, **kwargs: Any) -> T:
        return self.factory(**{**self.preset, **kwargs})


class Registry(Generic[T]):
    """A named table of factories.

    Examples:
        >>> r = Registry("colour")
        >>> r.register("red", dict, description="a dict", shade=1)
        >>> r.create("red")
        {'shade': 1}
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, factory: Callable[..., T], *, description: str = "", **preset: Any) -> None:
        key = name.lower()
        if key in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[key] = Entry(key, factory, description, dict(preset))

    def __call__(
        self, name: str, *, description: str = "", **preset: Any
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator form of :meth:`register`."""

        def deco(factory: Callable[..., T]) -> Callable[..., T]:
            self.register(name, factory, description=description, **preset)
            return factory

        return deco

    def get(self, name: str) -> Entry[T]:
        if not isinstance(name, str):
            raise ConfigError(f"{self.kind} must be given by name (a string); got {type(name).__name__}")
        key = name.lower()
        if key not in self._entries:
            close = difflib.get_close_matches(key, self._entries, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"Unknown {self.kind} {name!r}. Available: {', '.join(self.available())}.{hint}"
            )
        return self._entries[key]

    def create(self, name: str, **kwargs: Any) -> T:
        return self.get(name).create(**kwargs)

    def available(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(self._entries.values())
